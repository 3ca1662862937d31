"""What the log says while the backend is unavailable: one WARNING when it goes (with the
reason), a reminder every minute while it stays away, one INFO when a call gets its answer
again; a traceback only for an error that is not an outage."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from replicron import Scheduler, every
from replicron.backends import MemoryBackend, Release, RunRecord
from replicron.backends.base import Claim, ClaimRequest, LastFinish
from replicron.testing import FakeClock

#: Events that are a tick's outcome (one record per tick by design), not the backend's health.
_OUTCOMES = {"missed", "succeeded"}


class OutageBackend(MemoryBackend):
    """The in-process backend, with its calls (those named in ``only``, if set) failing with
    ``failure`` while it is set, as a database's would while it is down (``ConnectionError``)
    or broken (anything else)."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: Exception | None = None
        self.only: set[str] | None = None

    def _check(self, call: str) -> None:
        if self.failure is not None and (self.only is None or call in self.only):
            raise self.failure

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        self._check("claim")
        return await super().claim(requests)

    async def release(self, releases: Sequence[Release]) -> None:
        self._check("release")
        await super().release(releases)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        self._check("record_unclaimed")
        return await super().record_unclaimed(records)

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        self._check("last_ticks")
        return await super().last_ticks(jobs)

    async def last_finishes(self, jobs: Sequence[str]) -> dict[str, LastFinish]:
        self._check("last_finishes")
        return await super().last_finishes(jobs)

    async def announce(self, *args: Any, **kwargs: Any) -> Any:
        self._check("announce")
        return await super().announce(*args, **kwargs)

    async def cluster_status(self) -> Any:
        self._check("cluster_status")
        return await super().cluster_status()


Outage = Callable[..., list[logging.LogRecord]]


@pytest.fixture
def outage(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> Iterator[Outage]:
    """A scheduler with one job every second on an :class:`OutageBackend`; call the result
    to have every backend call fail with an error for so many seconds, then answer for so
    many more (``only``: the calls of these names fail, the others answer): it returns
    replicron's records meanwhile."""
    backend = OutageBackend()
    scheduler = Scheduler(clock=clock, backend=backend)
    scheduler.add_job(every(seconds=1), lambda: None, name="beat")
    scheduler.start()
    scheduler.wait_idle()

    def advance(seconds: int) -> None:  # one second at a time: each second's ticks handled
        for _ in range(seconds):
            clock.advance(timedelta(seconds=1))
            scheduler.wait_idle()

    def run(
        failure: Exception, seconds: int, after: int, only: set[str] | None = None
    ) -> list[logging.LogRecord]:
        caplog.set_level(logging.DEBUG, logger="replicron")
        caplog.clear()
        backend.failure, backend.only = failure, only
        advance(seconds)
        backend.failure = None
        advance(after)
        return [r for r in caplog.records if r.name.startswith("replicron")]

    try:
        yield run
    finally:
        scheduler.shutdown()


def said(records: list[logging.LogRecord]) -> list[tuple[str, str]]:
    """(level, message) of the records at INFO and above, ticks' outcomes left out."""
    return [
        (r.levelname, r.getMessage())
        for r in records
        if r.levelno >= logging.INFO and getattr(r, "event", None) not in _OUTCOMES
    ]


def test_an_outage_is_one_warning_a_reminder_a_minute_and_one_info_when_it_answers(
    outage: Outage,
) -> None:
    # Each second a claim fails, and from the second on the ticks before it fail to be
    # recorded missed: none of those may say more than the first.
    records = outage(ConnectionError("connection refused"), 150, 3)
    assert said(records) == [
        (
            "WARNING",
            "backend unavailable (claiming ticks): connection refused; trying again every "
            "1 s: the ticks that fall due meanwhile are handled once it answers",
        ),
        (
            "WARNING",
            "backend still unavailable after 1m (recording ticks missed: connection refused)",
        ),
        (
            "WARNING",
            "backend still unavailable after 2m (recording ticks missed: connection refused)",
        ),
        (
            "INFO",
            "ticks that fell due while the backend was unavailable: 0 to run, 150 recorded "
            "missed (by each job's catch_up and misfire_grace)",
        ),
        # Once the claims answer too, not merely the records of the ticks missed.
        ("INFO", "backend available again after 2m30s"),
    ]
    assert [r for r in records if r.exc_info] == []
    assert [r for r in records if r.levelno >= logging.ERROR] == []


def test_an_error_that_is_no_outage_gets_one_traceback_until_the_backend_answers(
    outage: Outage,
) -> None:
    records = outage(KeyError("a bug"), 5, 1)
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert [(r.getMessage(), bool(r.exc_info)) for r in errors] == [
        ("backend failed (claiming ticks): KeyError('a bug')", True)
    ]
    assert ("INFO", "backend available again after 5s") in said(records)


def test_a_backend_answering_some_calls_is_not_said_to_come_and_go(outage: Outage) -> None:
    """Claims time out (their table is locked, say) while the ticks missed meanwhile are
    recorded every second: one WARNING, and the INFO only once the claims answer."""
    records = outage(TimeoutError("no answer within 2.5 s"), 30, 2, only={"claim"})
    health = [
        (r.levelname, r.getMessage())
        for r in records
        if getattr(r, "event", None) in ("backend_unavailable", "backend_available")
    ]
    assert health == [
        (
            "WARNING",
            "backend unavailable (claiming ticks): no answer within 2.5 s; trying again every "
            "1 s: the ticks that fall due meanwhile are handled once it answers",
        ),
        ("INFO", "backend available again after 30s"),
    ]
