"""Catch-up after a long downtime: past the enumeration bound a job's older missed ticks are
one range record (first, last, count), every tick is covered by exactly one record, and the
counts (status, metrics) and the log tell how many were missed."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from replicron import EmbeddedBackend, Scheduler, every
from replicron._engine.planner import MAX_ENUMERATED_TICKS
from replicron.backends import MemoryBackend, Release, RunRecord, memory
from replicron.backends.base import Claim, ClaimRequest
from replicron.metrics import ReplicronCollector
from replicron.testing import FakeClock
from tests.helpers import Recorder, ran_once_then_down, step

SECOND = timedelta(seconds=1)
DOWN = timedelta(hours=2)


def a_while_ago() -> datetime:
    """A whole second some hours back: the ticks of the test fall within the status's last
    day, which the ledger measures on the system clock."""
    return datetime.now(UTC).replace(microsecond=0) - 3 * DOWN


def test_a_per_second_job_two_hours_behind_counts_every_missed_tick_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, first_tick = ran_once_then_down(tmp_path, a_while_ago(), DOWN)

    caplog.set_level(logging.INFO, logger="replicron")
    second = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path))
    recorder = Recorder()
    second.add_listener(recorder)
    second.add_job(every(seconds=1), lambda: None, name="fast")
    collector = ReplicronCollector(second, cluster_every=3600)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        second.start()
        recorder.wait_count("after_success", 1)  # the latest tick runs (catch_up="latest")
        second.wait_idle()
        missed = DOWN // SECOND - 1
        status = second.cluster_status().job("fast")
        assert status is not None
        assert status.missed == missed  # what `replicron status` and the page show
        labels = {"job": "fast", "outcome": "missed"}
        assert registry.get_sample_value("replicron_job_runs_total", labels) == missed
        assert sum(event.ticks for event in recorder.of("on_missed")) == missed
    finally:
        second.shutdown(timeout=5)
        collector.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"job 'fast' tick {(first_tick + SECOND).isoformat()}: {missed} ticks missed, from "
        f"this one through {(first_tick + DOWN - SECOND).isoformat()}: no replica ran it when "
        "it fell due (caught up on start)"
    ]


class LostAnswerBackend(MemoryBackend):
    """The in-process backend as a replica sees a database going away: once ``lose_next``
    is set, the next claim is committed but its answer is lost with the connection, and
    every call fails until ``down`` is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = self.down = False
        self.lost: list[datetime] = []  # the ticks of the claim whose answer was lost

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("connection refused")

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        self._check()
        claims = await super().claim(requests)
        if self.lose_next:
            self.lose_next, self.down = False, True
            self.lost = [request.scheduled_at for request in requests]
            for request in requests:  # a lock held by the lost session goes with it
                job = self.state.job(request.job)
                job.lock_replica = job.lock_run_id = None
            raise ConnectionError("server closed the connection unexpectedly")
        return claims

    async def release(self, releases: Sequence[Release]) -> None:
        self._check()
        await super().release(releases)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        self._check()
        return await super().record_unclaimed(records)


def test_an_outage_past_the_enumeration_bound_after_a_lost_claim_leaves_no_tick_unrecorded(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "TICKS_KEPT", 10_000)  # every tick's row stays to be counted
    backend = LostAnswerBackend()
    scheduler = Scheduler(clock=clock, backend=backend)
    scheduler.add_job(every(seconds=1), lambda: None, name="beat")
    scheduler.start()
    try:
        scheduler.wait_idle()
        step(clock, clock.now() + SECOND)
        backend.lose_next = True  # the next claim is the last that reaches the server
        step(clock, clock.now() + SECOND)
        step(clock, clock.now() + SECOND)
        [lost] = backend.lost
        outage = 1500 * SECOND  # past MAX_ENUMERATED_TICKS: the oldest ticks are a range
        clock.set(lost + outage)
        scheduler.wait_idle()
        caplog.set_level(logging.INFO, logger="replicron")
        backend.down = False
        for _ in range(30):  # the scheduler retries the backend within seconds
            step(clock, clock.now() + SECOND)
        end = clock.now()
    finally:
        scheduler.shutdown()
    job = backend.state.jobs["beat"]
    [(start, (last, range_ticks))] = job.ranges.items()  # POSIX timestamps
    # The rows of single ticks: the claimed keys less the range's own two.
    rows = set(job.claimed) - {start, last}
    # The lost claim's tick keeps its row; the range begins at the first tick with none.
    assert lost.timestamp() in rows
    assert start == (lost + SECOND).timestamp()
    covered = Counter(rows)
    in_range = [key for key in rows if start <= key <= last]
    tick = start
    while tick <= last:
        covered[tick] += tick not in rows
        tick += 1
    assert range_ticks == last - start + 1 - len(in_range)
    every_tick = {lost.timestamp() + n for n in range(int((end - lost) / SECOND))}
    assert set(covered) == every_tick
    assert set(covered.values()) == {1}
    [said] = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "resync"]
    # What was written: the range's ticks (the lost claim's tick has its own row) and the
    # latest ticks one by one.
    assert f"0 to run, {range_ticks + MAX_ENUMERATED_TICKS} recorded missed" in said
