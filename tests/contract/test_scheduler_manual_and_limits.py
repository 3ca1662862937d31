"""Manual runs (``run_now``) and limited runs (``max_runs``) of schedulers sharing a backend,
on every backend (``conftest.STORES``), driven by one FakeClock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from replicron import Outcome, current_run, every
from replicron._schedule.tz import MICROSECOND
from tests.contract.conftest import STORES, Store, replica
from tests.helpers import Recorder, poll_until, z

START = z(2026, 1, 1)
T = [START + timedelta(seconds=10 * k) for k in range(10)]


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as made:
        yield made


class Replicas:
    """Two schedulers on one store and one FakeClock, each with a Recorder; what their tasks
    saw: (replica, scheduled_at, manual)."""

    def __init__(self, store: Store) -> None:
        from replicron.testing import FakeClock

        self.clock = FakeClock(START)
        self.recorders = [Recorder(), Recorder()]
        self.schedulers = [replica(store, i, self.clock, self.recorders[i]) for i in range(2)]
        self.ran: list[tuple[str, datetime, bool]] = []
        self._lock = threading.Lock()

    def task(self) -> None:
        run = current_run()
        with self._lock:
            self.ran.append((run.replica_id, run.scheduled_at, run.manual))

    def at(self, instant: datetime) -> None:
        self.clock.set(instant)
        self.idle()

    def idle(self) -> None:
        for scheduler in self.schedulers:
            scheduler.wait_idle()

    def scheduled_runs(self) -> list[datetime]:
        return sorted(at for _, at, manual in self.ran if not manual)

    def manual_runs(self) -> list[tuple[str, datetime]]:
        return sorted((replica, at) for replica, at, manual in self.ran if manual)


@pytest.fixture
def replicas(store: Store) -> Iterator[Replicas]:
    made = Replicas(store)
    for scheduler in made.schedulers:
        scheduler.start()
    yield made
    for scheduler in made.schedulers:
        scheduler.shutdown(timeout=5)


def test_run_now_at_a_tick_another_replica_claimed_runs_as_a_manual_run(
    replicas: Replicas,
) -> None:
    jobs = [
        s.add_job(every(seconds=10), replicas.task, name="report", overlap="allow")
        for s in replicas.schedulers
    ]  # (overlap allowed: the two manual runs may run at once)
    replicas.at(T[1])
    assert replicas.scheduled_runs() == [T[1]]
    # Both replicas ask at the tick's very instant, and at the same microsecond as each other:
    # neither is taken for the tick, nor for the other's manual run.
    for job in jobs:
        job.run_now()
    replicas.idle()
    manual = replicas.manual_runs()
    assert sorted(replica for replica, _ in manual) == ["r0", "r1"]
    assert sorted(at for _, at in manual) == [T[1] + MICROSECOND, T[1] + 2 * MICROSECOND]
    for recorder in replicas.recorders:
        [succeeded] = [e for e in recorder.of("after_success") if e.manual]
        assert succeeded.outcome is Outcome.SUCCEEDED
    # The schedule goes on as before.
    assert [job.next_run() for job in jobs] == [T[2], T[2]]
    replicas.at(T[2])
    assert replicas.scheduled_runs() == [T[1], T[2]]


def test_max_runs_counts_the_runs_of_every_replica(replicas: Replicas) -> None:
    jobs = [
        s.add_job(every(seconds=10), replicas.task, name="report", max_runs=2)
        for s in replicas.schedulers
    ]
    for k in range(1, 6):
        replicas.at(T[k])
    assert replicas.scheduled_runs() == [T[1], T[2]]
    assert [job.next_run() for job in jobs] == [None, None]
    # Ticks past the limit are not ticks of the job: none was recorded missed.
    for recorder in replicas.recorders:
        assert all(at <= T[2] for at, _ in recorder.outcomes())
    # A manual run is not one of the limited runs.
    jobs[1].run_now()
    replicas.idle()
    assert replicas.manual_runs() == [("r1", T[5] + MICROSECOND)]  # off the tick at T[5]


def test_run_now_while_the_job_runs_on_another_replica_is_skipped_and_recorded(
    replicas: Replicas,
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(10)

    first = replicas.schedulers[0].add_job(every(seconds=10), slow, name="report")
    first.run_now()
    assert started.wait(10)
    second = replicas.schedulers[1].add_job(every(seconds=10), slow, name="report")
    second.run_now()
    replicas.schedulers[1].wait_idle()
    release.set()
    replicas.idle()
    [skipped] = replicas.recorders[1].of("on_skipped")
    assert (skipped.outcome, skipped.manual) == (Outcome.SKIPPED_OVERLAP, True)
    [ran] = replicas.recorders[0].of("after_success")
    assert (ran.scheduled_at, ran.manual) == (START + MICROSECOND, True)


def test_queued_manual_runs_and_a_queued_tick_all_wait_their_turn(replicas: Replicas) -> None:
    # overlap="queue" keeps one tick waiting (a later one replaces it), but a manual run was
    # asked for on purpose: none replaces another, nor the tick, nor is replaced by it.
    scheduler = replicas.schedulers[0]
    first, release = threading.Event(), threading.Event()

    def task() -> None:
        replicas.task()
        if not first.is_set():
            first.set()
            release.wait(10)

    job = scheduler.add_job(every(seconds=10), task, name="report", overlap="queue")
    job.run_now()
    assert first.wait(10)
    state = scheduler._engine.registry.get("report")
    assert state is not None
    job.run_now()
    replicas.clock.set(T[1])
    job.run_now()

    def queued() -> bool:
        return state.pending is not None and len(state.pending_manual or ()) == 2

    poll_until("two manual runs and a tick queued", queued, 10)
    release.set()
    scheduler.wait_idle()
    assert replicas.scheduled_runs() == [T[1]]
    assert [at for _, at in replicas.manual_runs()] == [
        START + MICROSECOND,
        START + 2 * MICROSECOND,
        T[1] + MICROSECOND,
    ]
    outcomes = replicas.recorders[0].outcomes()
    assert sorted(outcomes) == sorted(
        (at, Outcome.SUCCEEDED)
        for at in (START + MICROSECOND, START + 2 * MICROSECOND, T[1], T[1] + MICROSECOND)
    )
