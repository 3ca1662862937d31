"""A replica that stops mid-burst leaves the ticks it had not claimed to the replicas that
stay, which hold them too and claim them as their threads free up; only the last replica to
stop records them missed. Two schedulers on one embedded state directory, one worker thread
each, a burst of four runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from replicron import EmbeddedBackend, Outcome, Scheduler, current_run, every
from replicron.testing import FakeClock
from tests.helpers import START, Recorder, step

TICK = START + timedelta(seconds=30)
JOBS = [f"job-{n}" for n in range(4)]


class HeldByReplica:
    """A task that, on each replica, holds its thread until that replica's event is set."""

    def __init__(self) -> None:
        self.go = {"a": threading.Event(), "b": threading.Event()}
        self.started = threading.Semaphore(0)
        self.ran: list[tuple[str, str]] = []

    def __call__(self) -> None:
        run = current_run()
        self.ran.append((run.replica_id, run.job_name))
        self.started.release()
        assert self.go[run.replica_id].wait(10)


def replica(tmp_path: Path, clock: FakeClock, name: str, recorder: Recorder) -> Scheduler:
    backend = EmbeddedBackend(tmp_path / "state")
    return Scheduler(
        clock=clock, backend=backend, max_workers=1, replica_id=name, listeners=[recorder]
    )


@pytest.fixture
def two(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[Scheduler, Scheduler, Recorder]]:
    recorder = Recorder()
    made = [replica(tmp_path, clock, name, recorder) for name in ("a", "b")]
    yield made[0], made[1], recorder
    for s in made:
        s.shutdown(wait=False)


def test_a_replica_stopped_mid_burst_leaves_its_ticks_to_the_one_that_stays(
    two: tuple[Scheduler, Scheduler, Recorder], clock: FakeClock
) -> None:
    a, b, recorder = two
    task = HeldByReplica()
    for s in (a, b):
        for job in JOBS:
            s.add_job(every(hours=1, anchor=TICK), task, name=job)
        s.start()
    step(clock, TICK)
    for _ in range(2):  # one run on each replica's one thread; two ticks left unclaimed
        assert task.started.acquire(timeout=10)
    stopping = threading.Thread(target=a.shutdown)
    stopping.start()
    task.go["a"].set()  # a's run ends: a stops, leaving the two ticks to b
    stopping.join(10)
    assert not stopping.is_alive()
    task.go["b"].set()  # b's thread is free only now
    succeeded = recorder.wait_count("after_success", len(JOBS))
    assert sorted(e.job for e in succeeded) == JOBS
    assert recorder.of("on_missed") == []
    assert [replica for replica, _ in task.ran].count("b") == 3


def test_the_last_replica_to_stop_records_the_ticks_nobody_ran(
    two: tuple[Scheduler, Scheduler, Recorder], clock: FakeClock
) -> None:
    a, b, recorder = two
    task = HeldByReplica()
    for s in (a, b):
        for job in JOBS:
            s.add_job(every(hours=1, anchor=TICK), task, name=job)
        s.start()
    step(clock, TICK)
    for _ in range(2):
        assert task.started.acquire(timeout=10)
    stopping = [threading.Thread(target=s.shutdown) for s in (a, b)]
    for thread in stopping:
        thread.start()
    for event in task.go.values():
        event.set()
    for thread in stopping:
        thread.join(10)
    missed = recorder.of("on_missed")
    assert len(recorder.of("after_success")) == 2
    assert sorted(e.job for e in missed) == sorted(set(JOBS) - {j for _, j in task.ran})
    assert {e.outcome for e in missed} == {Outcome.MISSED}


def test_a_replica_that_joined_after_the_tick_is_not_handed_it(
    two: tuple[Scheduler, Scheduler, Recorder], clock: FakeClock
) -> None:
    """b starts after the burst's instant, so it never planned those ticks: a, stopping,
    records them missed rather than leave them to b, where nobody would run or record them.
    b's catch-up at start finds the ones still without a record, as it would for any job
    whose latest record is older (these have none yet: it reads where their registrations
    began), and claims them: whichever of the two gets a tick first, each ends with exactly
    one outcome, and none runs twice."""
    a, b, recorder = two
    task = HeldByReplica()
    for s in (a, b):
        for job in JOBS:
            s.add_job(every(hours=1, anchor=TICK), task, name=job)
    a.start()
    step(clock, TICK)
    assert task.started.acquire(timeout=10)  # a's one thread; the other three ticks wait
    b.start()
    stopping = threading.Thread(target=a.shutdown)
    stopping.start()
    task.go["a"].set()
    stopping.join(10)
    assert not stopping.is_alive()
    task.go["b"].set()
    b.shutdown()
    succeeded = [e.job for e in recorder.of("after_success")]
    missed = [e.job for e in recorder.of("on_missed")]
    assert sorted(succeeded + missed) == JOBS  # every tick has its one outcome
    ran = [job for _, job in task.ran]
    assert sorted(ran) == sorted(succeeded)  # each run once, and only those
    assert task.ran[0][0] == "a"
