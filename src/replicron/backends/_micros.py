"""How the SQLite ledger keeps instants: whole microseconds since the Unix epoch, in UTC.

An integer sorts and compares like the instant and holds it exactly (a datetime holds no
finer), where SQLite's text dates would need one format kept everywhere.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["MICROSECOND", "from_micros", "to_micros"]

MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(instant: datetime) -> int:
    """Whole microseconds since the Unix epoch; ``instant`` must be aware."""
    return (instant - _EPOCH) // MICROSECOND


def from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)
