"""Catch-up after a long downtime: past the enumeration bound a job's older missed ticks are
one range record (first, last, count), every tick is covered by exactly one record, and the
counts (status, metrics) and the log tell how many were missed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from replicron import EmbeddedBackend, Scheduler, every
from replicron.metrics import ReplicronCollector
from replicron.testing import FakeClock
from tests.helpers import Recorder, step

SECOND = timedelta(seconds=1)
DOWN = timedelta(hours=2)


def a_while_ago() -> datetime:
    """A whole second some hours back: the ticks of the test fall within the status's last
    day, which the ledger measures on the system clock."""
    return datetime.now(UTC).replace(microsecond=0) - 3 * DOWN


def test_a_per_second_job_two_hours_behind_counts_every_missed_tick_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(a_while_ago())
    first_tick = clock.now() + SECOND
    with Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path)) as first:
        ran = Recorder()
        first.add_listener(ran)
        first.add_job(every(seconds=1), lambda: None, name="fast")
        step(clock, first_tick)
        ran.wait_count("after_success", 1)
    clock.set(first_tick + DOWN)  # the ticks of the 2 h after the first fell due meanwhile

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
