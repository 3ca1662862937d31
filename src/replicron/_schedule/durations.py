"""Durations given as a timedelta or a number of seconds, checked the same way everywhere."""

from __future__ import annotations

import math
from datetime import timedelta

from replicron.errors import ReplicronError

__all__ = ["as_duration"]


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
