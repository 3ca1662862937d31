"""Anchored intervals, jitter and random intervals, all computed in whole microseconds.

Tick ``k`` of a plain interval is ``anchor + k * interval`` (k >= 0). With jitter ``J`` it is
delayed by ``floor(r(k) * J)``, where ``r`` is a repeatable fraction drawn from the job's key
and ``k``; ``J`` is below the interval, so ticks stay in order. Random intervals come in
complementary pairs: gaps ``g`` and ``lo + hi - g``, so tick ``2j`` sits at
``anchor + j * (lo + hi)`` and any tick is computed directly, without replaying history.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from replicron.errors import InvalidIntervalError

from .durations import as_duration, duration_text
from .tz import EPOCH, MICROSECOND, from_micros, to_micros

__all__ = ["IntervalRule", "duration_text", "make_interval_rule", "random_fraction"]

_UNIT = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}


def random_fraction(key: str, index: int) -> float:
    """A number in [0, 1) that depends only on ``key`` and ``index`` (same on every host)."""
    digest = hashlib.blake2b(f"{key}\0{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class IntervalRule:
    anchor: datetime
    interval: timedelta | None
    jitter: timedelta | None
    between: tuple[timedelta, timedelta] | None
    anchor_given: bool = field(default=False, compare=False)
    _anchor_us: int = field(init=False, repr=False, compare=False)
    _step_us: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_anchor_us", to_micros(self.anchor))
        step = 0 if self.interval is None else self.interval // MICROSECOND
        object.__setattr__(self, "_step_us", step)

    def next_after(self, instant: datetime, key: str) -> datetime | None:
        now = (instant - EPOCH) // MICROSECOND
        anchor = self._anchor_us
        if self.jitter is None and self.between is None:  # the common case, kept cheap
            step = self._step_us
            k = (now - anchor) // step + 1 if now >= anchor else 0
            return EPOCH + timedelta(microseconds=anchor + k * step)
        if self.between is not None:
            lo, hi = (d // MICROSECOND for d in self.between)
            period = lo + hi
            pair = max(0, (now - anchor) // period)
            base = anchor + pair * period
            middle = base + lo + int(random_fraction(key, pair) * (hi - lo))
            candidates = [base, middle, base + period]
        else:
            assert self.interval is not None
            step = self.interval // MICROSECOND
            k = max(0, (now - anchor) // step)
            candidates = [self._tick(anchor, step, k + i, key) for i in range(2)]
        return next((from_micros(c) for c in candidates if c > now), None)

    def _tick(self, anchor: int, step: int, k: int, key: str) -> int:
        tick = anchor + k * step
        if self.jitter:
            tick += int(random_fraction(key, k) * (self.jitter // MICROSECOND))
        return tick

    def describe(self) -> str:
        parts = []
        if self.between is not None:
            parts.append(f"between=({_text(self.between[0])}, {_text(self.between[1])})")
        else:
            assert self.interval is not None
            parts.append(_text(self.interval))
        if self.jitter:
            parts.append(f"jitter={_text(self.jitter)}")
        if self.anchor != EPOCH:
            parts.append(f"anchor={self.anchor.isoformat()!r}")
        return f"every({', '.join(parts)})"

    def readable(self) -> str:
        """The rule for a person, durations as a config writes them: ``every 5s``,
        ``every 1h30m, jitter 10s``, ``every 1m to 5m``, ``every 1d, from 2026-...``."""
        if self.between is not None:
            text = f"every {duration_text(self.between[0])} to {duration_text(self.between[1])}"
        else:
            assert self.interval is not None
            text = f"every {duration_text(self.interval)}"
        if self.jitter:
            text += f", jitter {duration_text(self.jitter)}"
        if self.anchor != EPOCH:
            text += f", from {self.anchor.isoformat()}"
        return text


def _text(delta: timedelta) -> str:
    return f"timedelta(seconds={delta.total_seconds():g})"


def _duration(value: object, what: str) -> timedelta:
    return as_duration(value, what, InvalidIntervalError)


def make_interval_rule(
    interval: Any,
    *,
    seconds: float,
    minutes: float,
    hours: float,
    days: float,
    jitter: Any,
    anchor: datetime | None,
    between: Any,
) -> IntervalRule:
    parts_given = any((seconds, minutes, hours, days))
    if interval is not None and not isinstance(interval, timedelta):
        raise InvalidIntervalError(
            f"every() takes a timedelta, not {interval!r}: write every(seconds=...) "
            "or every(timedelta(...))"
        )
    if interval is not None and parts_given:
        raise InvalidIntervalError("give every() a timedelta or seconds=/minutes=/..., not both")
    if interval is None and parts_given:
        parts = {"seconds": seconds, "minutes": minutes, "hours": hours, "days": days}
        interval = timedelta(0)
        for unit, amount in parts.items():
            try:
                interval += _duration(amount, unit) * _UNIT[unit]
            except OverflowError:
                raise InvalidIntervalError(
                    f"every({unit}={amount!r}) is longer than a timedelta can hold"
                ) from None
    given = anchor is not None
    anchor = EPOCH if anchor is None else anchor
    if between is not None:
        if interval is not None or jitter is not None:
            raise InvalidIntervalError("between= replaces the interval and jitter; give it alone")
        return IntervalRule(anchor, None, None, _bounds(between), given)
    if interval is None:
        raise InvalidIntervalError("every() needs an interval, e.g. every(minutes=5)")
    if interval <= timedelta(0):
        raise InvalidIntervalError(f"interval must be positive, got {duration_text(interval)}")
    if interval < MICROSECOND:
        raise InvalidIntervalError(
            f"interval {duration_text(interval)} is shorter than a microsecond"
        )
    jitter_delta = None
    if jitter is not None:
        jitter_delta = _duration(jitter, "jitter")
        if jitter_delta < timedelta(0):
            raise InvalidIntervalError(
                f"jitter must not be negative, got {duration_text(jitter_delta)}"
            )
        if jitter_delta >= interval:
            raise InvalidIntervalError(
                f"jitter {duration_text(jitter_delta)} must be shorter than the interval "
                f"{duration_text(interval)}"
            )
    return IntervalRule(anchor, interval, jitter_delta or None, None, given)


def _bounds(between: Any) -> tuple[timedelta, timedelta]:
    try:
        low_value, high_value = between
    except (TypeError, ValueError):
        raise InvalidIntervalError(f"between= must be a pair (min, max), not {between!r}") from None
    low, high = _duration(low_value, "between min"), _duration(high_value, "between max")
    if low <= timedelta(0):
        raise InvalidIntervalError(f"between min must be positive, got {duration_text(low)}")
    if low >= high:
        raise InvalidIntervalError(
            f"between min {duration_text(low)} must be less than max {duration_text(high)}"
        )
    return low, high
