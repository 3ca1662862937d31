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


_UNITS = (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000))


def duration_text(delta: timedelta) -> str:
    """``delta`` as a daemon config writes a duration, its sign in front: ``1m30s``,
    ``500ms``, ``1d2h``, ``12.5s``, ``-1s`` (``str(timedelta)`` writes minus one second as
    ``-1 day, 23:59:59``). Every replicron surface shows durations so: a user reads back what
    they would write."""
    sign = "-" if delta < timedelta(0) else ""
    left = abs(delta) // timedelta(microseconds=1)
    parts = []
    for unit, size in _UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    if left and left < 1_000_000 and left % 1000 == 0:
        parts.append(f"{left // 1000}ms")
    elif left:
        parts.append(f"{left / 1_000_000:.6f}".rstrip("0").rstrip(".") + "s")
    return sign + ("".join(parts) or "0s")
