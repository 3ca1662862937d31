"""``misfire_grace`` and ``max_runs`` on PostgreSQL, where the ledger counts the runs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Literal

import psycopg
import pytest

from replicron import Scheduler, every
from replicron.postgres import PostgresBackend
from replicron.testing import FakeClock
from tests.helpers import Gate, Recorder, step
from tests.unit.conftest import clock, recorder
from tests.unit.test_misfire_grace import T, make, max_runs_while_ticking

__all__ = ["clock", "make", "recorder"]  # the fixtures


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_run_missed_on_its_thread_does_not_use_up_max_runs_while_the_job_ticks(
    make: Callable[..., Scheduler],
    clock: FakeClock,
    recorder: Recorder,
    dsn: str,
    coordination: Literal["advisory", "lease"],
) -> None:
    backend = PostgresBackend(dsn, coordination=coordination, heartbeat_interval=0.5)
    s = make(clock=clock, listeners=[recorder], max_workers=1, backend=backend)
    max_runs_while_ticking(s, clock, recorder, shared=True)


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_claimed_tick_missed_past_its_grace_keeps_no_start_time(
    make: Callable[..., Scheduler],
    clock: FakeClock,
    recorder: Recorder,
    dsn: str,
    coordination: Literal["advisory", "lease"],
) -> None:
    """Queued behind its job's run, the tick's row was written when it was claimed; it never
    started, and its row says so."""
    gate = Gate()
    backend = PostgresBackend(dsn, coordination=coordination, heartbeat_interval=0.5)
    s = make(clock=clock, listeners=[recorder], backend=backend)
    s.add_job(every(seconds=10), gate, name="j", overlap="queue", misfire_grace=5)
    step(clock, T[1])
    gate.wait_started(1)
    step(clock, T[2])  # queued behind T[1]'s run
    step(clock, T[2] + timedelta(seconds=7))
    gate.release.set()
    recorder.wait_count("on_missed", 1, job="j")
    s.wait_idle()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT outcome, started_at FROM replicron_runs WHERE job = 'j' AND scheduled_at = %s",
            (T[2],),
        ).fetchone()
    assert row == ("missed", None)
