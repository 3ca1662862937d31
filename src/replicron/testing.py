"""Test helpers for replicron users: a clock you move by hand.

``FakeClock`` lets a test drive schedules through days, DST transitions and years without
sleeping::

    clock = FakeClock(datetime(2026, 3, 29, tzinfo=timezone.utc))
    clock.advance(timedelta(hours=1))
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ._schedule.tz import UTC
from .triggers import require_aware

__all__ = ["FakeClock"]


@dataclass(order=True)
class _AsyncSleeper:
    deadline: datetime
    seq: int
    loop: asyncio.AbstractEventLoop = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class FakeClock:
    """A clock that stands still until told to move.

    Sleepers (threads in :meth:`sleep_until`, tasks in :meth:`asleep_until`) wake when
    :meth:`advance` or :meth:`set` moves the time to or past their deadline. Thread-safe; tasks
    may live on any event loop. :meth:`wait_for_sleepers` lets a test wait, without sleeping,
    until the code under test has gone to sleep.
    """

    def __init__(self, start: datetime | None = None) -> None:
        initial = datetime(2026, 1, 1, tzinfo=UTC) if start is None else start
        self._now = require_aware(initial, "start").astimezone(UTC)
        self._cond = threading.Condition()
        self._async: list[_AsyncSleeper] = []
        self._thread_deadlines: list[datetime] = []
        self._seq = 0

    def now(self) -> datetime:
        with self._cond:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by ``delta`` (not negative) and wake the sleepers now due."""
        if delta < timedelta(0):
            raise ValueError(f"FakeClock cannot go backwards (advance by {delta})")
        with self._cond:
            return self._move(self._now + delta)

    def set(self, instant: datetime) -> datetime:
        """Jump to ``instant`` (backwards too, to test clock steps); wakes sleepers now due."""
        with self._cond:
            return self._move(require_aware(instant).astimezone(UTC))

    def _move(self, instant: datetime) -> datetime:
        self._now = instant
        self._cond.notify_all()
        due = sorted(s for s in self._async if s.deadline <= instant)
        self._async = [s for s in self._async if s.deadline > instant]
        for sleeper in due:
            sleeper.loop.call_soon_threadsafe(_resolve, sleeper.future)
        return instant

    def sleep_until(self, deadline: datetime, /) -> None:
        require_aware(deadline, "deadline")
        with self._cond:
            self._thread_deadlines.append(deadline)
            self._cond.notify_all()
            try:
                while self._now < deadline:
                    self._cond.wait()
            finally:
                self._thread_deadlines.remove(deadline)

    async def asleep_until(self, deadline: datetime, /) -> None:
        require_aware(deadline, "deadline")
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._now >= deadline:
                return
            sleeper = _AsyncSleeper(deadline, self._seq, loop, loop.create_future())
            self._seq += 1
            self._async.append(sleeper)
            self._cond.notify_all()
        try:
            await sleeper.future
        finally:
            with self._cond:
                if sleeper in self._async:
                    self._async.remove(sleeper)

    @property
    def sleepers(self) -> int:
        """How many threads and tasks are waiting on this clock now."""
        with self._cond:
            return len(self._thread_deadlines) + len(self._async)

    def next_deadline(self) -> datetime | None:
        """The earliest deadline any sleeper waits for, or ``None``."""
        with self._cond:
            deadlines = [*self._thread_deadlines, *(s.deadline for s in self._async)]
            return min(deadlines, default=None)

    def wait_for_sleepers(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Block until at least ``count`` sleepers wait; False if ``timeout`` passed first.

        This waits on a condition, not on time: it returns as soon as the code under test
        sleeps, so tests need no ``time.sleep``.
        """
        with self._cond:
            return self._cond.wait_for(
                lambda: len(self._thread_deadlines) + len(self._async) >= count, timeout
            )

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()!r})"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
