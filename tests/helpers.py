"""Small helpers shared by the tests."""

from __future__ import annotations

from datetime import UTC, datetime


def z(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    microsecond: int = 0,
) -> datetime:
    """An instant in UTC, written as its calendar fields (the way expectations read best)."""
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)
