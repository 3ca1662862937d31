"""Claiming by capacity (docs/scheduler.md, "Worker threads"): on a backend shared by
replicas in other processes, a replica claims at an instant only the runs its worker threads
can start promptly, leaves the rest to replicas with free threads, and claims more as its own
free up; nothing is lost or run twice. Two schedulers on one store, one FakeClock; every task
waits at a gate the test opens, so what was claimed can be counted while it runs."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest

from replicron import current_run, every
from replicron._engine.capacity import claim_margin
from replicron.testing import FakeClock
from tests.contract.conftest import STORES, Store, replica
from tests.helpers import Recorder, poll_until, z

START = z(2026, 1, 1)
T = [START + timedelta(seconds=10 * k) for k in range(4)]
#: The stores replicas of several processes share (the in-memory one lives in one process).
SHARED = [name for name in STORES if name != "memory"]


@pytest.fixture(params=SHARED)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as made:
        yield made


class Gated:
    """Schedulers with the given worker threads each; their tasks note who ran what, then
    wait for the gate."""

    def __init__(self, store: Store, workers: list[int]) -> None:
        self.clock = FakeClock(START)
        self.recorders = [Recorder() for _ in workers]
        self.schedulers = [
            replica(store, i, self.clock, self.recorders[i], max_workers=count)
            for i, count in enumerate(workers)
        ]
        self.gate = threading.Event()
        self.entered: list[tuple[str, str, datetime]] = []
        self._lock = threading.Lock()

    def task(self) -> None:
        run = current_run()
        with self._lock:
            self.entered.append((run.replica_id, run.job_name, run.scheduled_at))
        assert self.gate.wait(20)

    def all_due_at_once(self, count: int) -> list[str]:
        """``count`` jobs every 10 s on every scheduler, started, and the clock moved to T[1],
        when they all fall due at once."""
        names = [f"job-{n:02}" for n in range(count)]
        for scheduler in self.schedulers:
            for name in names:
                scheduler.add_job(every(seconds=10), self.task, name=name)
            scheduler.start()
        self.clock.set(T[1])
        return names

    def claimed(self, at: datetime) -> Counter[str]:
        """Runs of the tick at ``at`` each replica claimed and started."""
        return Counter(
            event.replica_id
            for recorder in self.recorders
            for event in recorder.of("before_run")
            if event.scheduled_at == at
        )

    def wait_claimed(self, at: datetime, count: int) -> None:
        def enough() -> bool:
            return sum(self.claimed(at).values()) >= count

        poll_until(f"{count} runs of {at} claimed", enough, 20)

    def entered_at(self, at: datetime) -> list[tuple[str, str]]:
        with self._lock:
            return [(replica, job) for replica, job, tick in self.entered if tick == at]

    def finish(self) -> None:
        self.gate.set()
        for scheduler in self.schedulers:
            scheduler.wait_idle()

    def shutdown(self) -> None:
        self.gate.set()
        for scheduler in self.schedulers:
            scheduler.shutdown(timeout=10)


Make = Callable[[list[int]], Gated]


@pytest.fixture
def make(store: Store) -> Iterator[Make]:
    made: list[Gated] = []

    def factory(workers: list[int]) -> Gated:
        made.append(Gated(store, workers))
        return made[-1]

    yield factory
    for gated in made:
        gated.shutdown()


def test_a_burst_is_shared_by_the_replicas_each_claiming_what_it_can_start(
    make: Make, store: Store
) -> None:
    gated: Gated = make([4, 4])
    names = gated.all_due_at_once(16)
    # Four threads and a margin of runs in hand each: that many claimed by each replica, the
    # others left for whoever frees a thread first.
    room = 4 + claim_margin(4)
    assert 4 < room < 8
    gated.wait_claimed(T[1], 2 * room)
    assert gated.claimed(T[1]) == Counter({"r0": room, "r1": room})
    poll_until("both replicas' threads busy", lambda: len(gated.entered_at(T[1])) == 8, 20)
    assert Counter(replica for replica, _ in gated.entered_at(T[1])) == {"r0": 4, "r1": 4}
    gated.finish()
    ran = gated.entered_at(T[1])
    assert sorted(job for _, job in ran) == names  # every tick once
    for name in names:
        assert [r.outcome for r in store.recorded(name).values()] == ["succeeded"]


def test_a_replica_with_free_threads_takes_what_a_busy_one_left(make: Make) -> None:
    gated: Gated = make([1, 8])
    gated.all_due_at_once(6)
    # r0 can start one run; r1 has eight threads: all six start at once, though r0's one
    # thread would have had to run them one after another.
    assert claim_margin(1) == 0
    poll_until("all six running", lambda: len(gated.entered_at(T[1])) == 6, 20)
    claimed = gated.claimed(T[1])
    assert claimed["r0"] <= 1
    assert claimed["r1"] >= 5
    gated.finish()


def test_a_tick_nobody_had_a_thread_for_is_recorded_missed_when_its_job_is_due_again(
    make: Make, store: Store
) -> None:
    gated: Gated = make([1, 1])
    names = gated.all_due_at_once(6)
    assert claim_margin(1) == 0  # one run each
    gated.wait_claimed(T[1], 2)
    started = {job for recorder in gated.recorders for job in _jobs(recorder, T[1])}
    left = sorted(set(names) - started)
    assert len(left) == 4
    gated.clock.set(T[2])  # every job is due again while every thread is taken

    def first_ticks_recorded() -> bool:
        return all(T[1] in store.recorded(name) for name in left)

    poll_until("the first ticks of the jobs left recorded", first_ticks_recorded, 20)
    gated.finish()
    for name in names:
        recorded = store.recorded(name)
        assert sorted(recorded) == [T[1], T[2]], name  # each tick once, none lost
    for name in left:
        first = store.recorded(name)[T[1]]
        assert first.outcome == "missed"
        assert first.error is not None
        assert "free worker thread" in first.error
        assert store.recorded(name)[T[2]].outcome == "succeeded"


def test_ticks_left_for_others_are_recorded_when_the_last_replica_stops(
    make: Make, store: Store
) -> None:
    gated: Gated = make([1])
    names = gated.all_due_at_once(4)
    scheduler = gated.schedulers[0]
    gated.wait_claimed(T[1], 1)
    left = sorted(set(names) - set(_jobs(gated.recorders[0], T[1])))
    assert len(left) == 3
    gated.gate.set()
    scheduler.shutdown(timeout=10)
    outcomes = {name: store.recorded(name)[T[1]].outcome for name in names}
    assert Counter(outcomes.values()) == {"succeeded": 1, "missed": 3}
    assert {name for name, outcome in outcomes.items() if outcome == "missed"} == set(left)


def _jobs(recorder: Recorder, at: datetime) -> list[str]:
    return [event.job for event in recorder.of("before_run") if event.scheduled_at == at]
