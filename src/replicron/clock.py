"""Clocks: where a scheduler gets the time and how it waits.

The scheduler never calls ``datetime.now`` or ``time.sleep`` itself; it asks its clock. Use
:class:`SystemClock` in production and :class:`replicron.testing.FakeClock` in tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from ._schedule.tz import UTC

__all__ = ["Clock", "ClusterClock", "SystemClock"]

# Sleep in slices no longer than this, so that a wall-clock step (NTP, suspend) is noticed.
_MAX_SLICE = 60.0
# An asyncio timer fires up to a millisecond late (the selector waits whole milliseconds,
# rounded up), and a burst of runs waits for it: the last stretch before a deadline shorter
# than this is slept on the thread instead, blocking the loop that long at most.
_FINE = 0.0015


@runtime_checkable
class Clock(Protocol):
    """The time source of a scheduler.

    ``now()`` returns an aware UTC datetime. ``sleep_until`` blocks the calling thread and
    ``asleep_until`` suspends the calling task until ``now() >= deadline``; both return at
    once for a deadline already past.
    """

    def now(self) -> datetime: ...

    def sleep_until(self, deadline: datetime, /) -> None: ...

    async def asleep_until(self, deadline: datetime, /) -> None: ...


class _RealTimeWaits:
    """Waits in real time, re-checked against ``now()`` in slices, so that a step of the
    clock (NTP, suspend, a new offset) is noticed."""

    def now(self) -> datetime:
        raise NotImplementedError

    def tells_unix_time(self) -> bool:
        """Whether :meth:`from_unix` works: the engine then stamps a sync run's start and end
        with ``time.time()`` on its worker thread (a tenth of the cost of an aware datetime)
        and makes datetimes of them later, off the path of a burst of runs."""
        return False

    def from_unix(self, unix: float, /) -> datetime:
        """This clock's time when the system clock read ``unix`` (a ``time.time()`` value)."""
        raise NotImplementedError

    def sleep_until(self, deadline: datetime, /) -> None:
        while (remaining := (deadline - self.now()).total_seconds()) > 0:
            time.sleep(min(remaining, _MAX_SLICE))

    async def asleep_until(self, deadline: datetime, /) -> None:
        while (remaining := (deadline - self.now()).total_seconds()) > 0:
            if remaining <= _FINE:
                time.sleep(remaining)
            else:
                await asyncio.sleep(min(remaining - _FINE, _MAX_SLICE))


class SystemClock(_RealTimeWaits):
    """The real clock: wall time from the OS, waits re-checked against it."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def tells_unix_time(self) -> bool:
        return True

    def from_unix(self, unix: float, /) -> datetime:
        return datetime.fromtimestamp(unix, UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


class ClusterClock(_RealTimeWaits):
    """A clock shifted by an offset measured elsewhere: the system clock corrected to the
    coordinator's (PostgreSQL's) clock, so every replica fires ticks on one time base whatever
    its own clock says. ``offset()`` is read on every call (it may be updated meanwhile, from
    another thread); ``None`` means not measured: the base clock's time."""

    def __init__(self, base: Clock, offset: Callable[[], timedelta | None]) -> None:
        self.base = base
        self._offset = offset

    def now(self) -> datetime:
        offset = self._offset()
        return self.base.now() if offset is None else self.base.now() + offset

    def tells_unix_time(self) -> bool:
        base = self.base
        return isinstance(base, _RealTimeWaits) and base.tells_unix_time()

    def from_unix(self, unix: float, /) -> datetime:
        base = self.base
        assert isinstance(base, _RealTimeWaits)
        offset = self._offset()
        return base.from_unix(unix) if offset is None else base.from_unix(unix) + offset

    def __repr__(self) -> str:
        return f"ClusterClock({self.base!r}, offset={self._offset()})"
