"""On PostgreSQL a tick is claimed shortly before it is due, and its run starts on time: the
claim's round trip (a commit, which a server syncing to disk may hold up) is off the run's
path. Real time, a real server."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

import pytest

from replicron import Scheduler, current_run, every
from replicron.backends import Claim, ClaimRequest
from replicron.postgres import PostgresBackend
from tests.helpers import Recorder

pytestmark = pytest.mark.timeout(60)

TICKS = 8
#: Ticks whose claim may come back after their instant: on a loaded machine (the suite's own
#: workers) a stall of a couple of seconds outgrows the lead of the claims it meets. A lead
#: that is not there makes every claim late.
LATE_AT_MOST = 3


class TimedClaims(PostgresBackend):
    """The real backend, noting when each of its claims came back (scheduler time)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.answered: dict[datetime, datetime] = {}
        self.scheduler: Scheduler | None = None

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        claims = await super().claim(requests)
        assert self.scheduler is not None
        now = self.scheduler.clock.now()
        for claim in claims:
            self.answered.setdefault(claim.scheduled_at, now)
        return claims


def test_ticks_are_claimed_ahead_and_run_on_time(dsn: str) -> None:
    backend = TimedClaims(dsn)
    scheduler = Scheduler(backend=backend, replica_id="r0")
    backend.scheduler = scheduler
    started: dict[datetime, datetime] = {}
    done = threading.Event()

    def task() -> None:
        run = current_run()
        started[run.scheduled_at] = scheduler.clock.now()
        if len(started) >= TICKS:
            done.set()

    scheduler.add_job(every(seconds=1), task, name="tick")
    with scheduler:
        assert done.wait(TICKS + 10)
    ticks = sorted(started.items())[:TICKS]
    # The lead is twice the slowest recent claim round trip: on a loaded machine a trip may
    # outgrow it (its tick then starts when the claim comes back, a little late), not most.
    ahead = [tick for tick, _ in ticks if backend.answered[tick] < tick]
    assert len(ahead) >= TICKS - LATE_AT_MOST, (
        f"claimed before due: {ahead} of {[t for t, _ in ticks]}"
    )
    for tick, start in ticks:
        assert start >= tick, "never started early"
        assert (start - tick).total_seconds() < 0.5  # generous: a loaded machine
        lead = (tick - backend.answered[tick]).total_seconds()
        assert lead <= PostgresBackend.claims_ahead.total_seconds()


class LosesTheSessionAfterClaiming(PostgresBackend):
    """The real backend, whose lock session is lost (as the backend reports it) right after
    its first claim that won a tick: before the tick's instant, since it was claimed ahead."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.lost: list[int] = []

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        claims = await super().claim(requests)
        won = [claim.run_id for claim in claims if claim.run_id is not None]
        if won and not self.lost:
            self.lost = won
            self._on_lock_lost(won)  # what a lost session or an expired lease reports
        return claims


def test_a_tick_whose_lock_is_lost_between_its_claim_and_its_instant_is_not_run(
    dsn: str,
) -> None:
    backend = LosesTheSessionAfterClaiming(dsn)
    recorder = Recorder()
    scheduler = Scheduler(backend=backend, replica_id="r0", listeners=[recorder])
    ran: list[datetime] = []
    scheduler.add_job(every(seconds=1), lambda: ran.append(current_run().scheduled_at), name="t")
    with scheduler:
        [abandoned] = recorder.wait_count("on_abandoned", 1, "t")
        [succeeded] = recorder.wait_count("after_success", 1, "t")
    assert backend.lost == [abandoned.run_id]
    assert abandoned.scheduled_at not in ran  # never started
    assert abandoned.started_at is None
    assert abandoned.detail is not None
    assert "before it started" in abandoned.detail
    assert succeeded.scheduled_at > abandoned.scheduled_at  # the next tick runs as usual
