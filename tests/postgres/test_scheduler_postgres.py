"""Schedulers on the PostgreSQL backend, driven by a FakeClock (real database, real sessions)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest

from replicron import Outcome, Scheduler, current_run, every
from replicron.postgres import PostgresBackend
from replicron.testing import FakeClock
from tests.helpers import Recorder, z

START = z(2026, 1, 1)
T = [START + timedelta(seconds=10 * k) for k in range(30)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def ledger(dsn: str) -> list[tuple[str, datetime, str, str | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT job, scheduled_at, replica_id, outcome FROM replicron_runs ORDER BY run_id"
        ).fetchall()
    return [(job, tick, replica, outcome) for job, tick, replica, outcome in rows]


def advisory_locks(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def replicas(dsn: str, clock: FakeClock) -> Iterator[list[Scheduler]]:
    made = [
        Scheduler(
            clock=clock,
            backend=PostgresBackend(dsn, heartbeat_interval=0.2),
            replica_id=f"r{i}",
        )
        for i in range(3)
    ]
    for s in made:
        s.start()
    yield made
    for s in made:
        s.shutdown(timeout=5)


def test_three_replicas_run_each_tick_once(
    dsn: str, clock: FakeClock, replicas: list[Scheduler]
) -> None:
    ran: list[tuple[str, datetime, int | None]] = []
    lock = threading.Lock()

    def task() -> None:
        run = current_run()
        with lock:
            ran.append((run.replica_id, run.scheduled_at, run.run_id))

    for s in replicas:
        s.add_job(every(seconds=10), task, name="report")
    for k in range(1, 11):
        clock.set(T[k])
        for s in replicas:
            s.wait_idle()
    assert sorted(t for _, t, _ in ran) == T[1:11]
    run_ids = [r or 0 for _, _, r in sorted(ran, key=lambda x: x[1])]
    assert 0 not in run_ids
    assert run_ids == sorted(set(run_ids))  # fencing tokens strictly increase
    rows = ledger(dsn)
    assert [(job, tick, outcome) for job, tick, _, outcome in rows] == [
        ("report", t, "succeeded") for t in T[1:11]
    ]
    for s in replicas:
        s.shutdown()
    assert advisory_locks(dsn) == 0


def test_restart_catches_up_from_the_ledger(dsn: str, clock: FakeClock) -> None:
    recorder = Recorder()
    with Scheduler(clock=clock, backend=PostgresBackend(dsn)) as s:
        s.add_job(every(seconds=10), lambda: None, name="c")
        clock.set(T[1])
        s.wait_idle()
    clock.set(T[4] + timedelta(seconds=5))
    with Scheduler(clock=clock, backend=PostgresBackend(dsn), listeners=[recorder]) as s:
        s.add_job(every(seconds=10), lambda: None, name="c")
        s.wait_idle()
    assert recorder.outcomes() == [
        (T[2], Outcome.MISSED),
        (T[3], Outcome.MISSED),
        (T[4], Outcome.SUCCEEDED),
    ]
    assert [(tick, outcome) for _, tick, _, outcome in ledger(dsn)] == [
        (T[1], "succeeded"),
        (T[2], "missed"),
        (T[3], "missed"),
        (T[4], "succeeded"),
    ]


def test_a_lost_lock_session_signals_the_run_and_records_it_abandoned(
    dsn: str, clock: FakeClock
) -> None:
    recorder = Recorder()
    started, stopped = threading.Event(), threading.Event()

    def long_job() -> None:
        started.set()
        if current_run().cancelled.wait(30):
            stopped.set()

    backend = PostgresBackend(dsn, heartbeat_interval=0.1)
    with Scheduler(clock=clock, backend=backend, replica_id="victim", listeners=[recorder]) as s:
        s.add_job(every(seconds=10), long_job, name="long")
        clock.set(T[1])
        assert started.wait(10)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'replicron victim'"
            )
        assert stopped.wait(10)  # the heartbeat noticed and the run was told to stop
        s.wait_idle()
        [lock_error] = recorder.of("on_lock_error")
        assert lock_error.job == "long"
        assert recorder.outcomes() == [(T[1], Outcome.ABANDONED)]
        # The session was reopened: the next tick runs normally.
        started.clear()
        clock.set(T[2])
        assert started.wait(10)
        s.shutdown(timeout=0.1)
    assert [(tick, outcome) for _, tick, _, outcome in ledger(dsn)] == [
        (T[1], "abandoned"),
        (T[2], "abandoned"),
    ]
    assert advisory_locks(dsn) == 0
