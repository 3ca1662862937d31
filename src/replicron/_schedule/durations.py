"""Durations given as a timedelta or a number of seconds, checked the same way everywhere."""

from __future__ import annotations

import math
from datetime import timedelta

from replicron.errors import ReplicronError

__all__ = ["as_duration", "duration_text"]


def as_duration(value: object, what: str, error: type[ReplicronError]) -> timedelta:
    """``value`` as a timedelta: a timedelta, or a finite number of seconds that a timedelta
    can hold. Anything else (a bool, a string, NaN, infinity, 10**20 seconds) raises
    ``error`` naming ``what``, rather than whatever ``timedelta()`` would raise."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{what} must be a timedelta or a number of seconds, not {value!r}")
    if not math.isfinite(value):
        raise error(f"{what} must be a finite number of seconds, not {value!r}")
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise error(f"{what} of {value!r} seconds is longer than a timedelta can hold") from None


_UNITS = ((86400, "day"), (3600, "h"), (60, "min"))


def duration_text(delta: timedelta) -> str:
    """``delta`` as a person writes it, its sign in front: ``-1 s``, ``1 min 30 s``,
    ``2 days 0.5 s`` (``str(timedelta)`` writes minus one second as ``-1 day, 23:59:59``)."""
    sign = "-" if delta < timedelta(0) else ""
    micros = abs(delta) // timedelta(microseconds=1)
    seconds, fraction = divmod(micros, 1_000_000)
    parts = []
    for size, unit in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            plural = "s" if unit == "day" and count > 1 else ""
            parts.append(f"{count} {unit}{plural}")
    if seconds or fraction or not parts:
        parts.append(f"{seconds + fraction / 1_000_000:g} s")
    return sign + " ".join(parts)
