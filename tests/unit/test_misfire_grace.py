"""``misfire_grace`` bounds every start, whatever delayed it: a worker thread, a capacity
deferral, the overlap queue, the concurrency limit's queue, a catch-up backlog, a manual run
holding the slot. A later start is recorded missed, and the job goes on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from replicron import EmbeddedBackend, MemoryBackend, MemoryState, Outcome, Scheduler, every
from replicron.testing import FakeClock
from tests.helpers import START, Gate, Recorder, step

T = [START + timedelta(seconds=10 * k) for k in range(40)]  # T[k]: tick k of every(10 s)
HOURLY_AT = T[1] + timedelta(seconds=1)  # the tick of an hourly job, just after j0's


@pytest.fixture
def make() -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def build(**options: Any) -> Scheduler:
        s = Scheduler(**options)
        s.start()
        made.append(s)
        return s

    yield build
    for s in made:
        s.shutdown(timeout=5)


def missed_detail(late: timedelta, grace: timedelta) -> str:
    return f"it would have started {late} after its tick, past misfire_grace {grace}"


@pytest.mark.parametrize(
    ("waited", "runs"),
    [(timedelta(minutes=5), False), (timedelta(seconds=60), True), (timedelta(seconds=30), True)],
)
def test_a_tick_waiting_for_a_worker_thread_is_missed_past_its_grace(
    make: Callable[..., Scheduler],
    clock: FakeClock,
    recorder: Recorder,
    waited: timedelta,
    runs: bool,
) -> None:
    # One thread, held by j0's run: j1's tick is claimed and started, and waits for it.
    blocker, late = Gate(), Gate()
    late.release.set()
    s = make(clock=clock, listeners=[recorder], max_workers=1)
    s.add_job(every(seconds=10), blocker, name="j0")
    s.add_job(every(hours=1, anchor=HOURLY_AT), late, name="j1", misfire_grace=60)
    step(clock, T[1])
    blocker.wait_started(1)
    step(clock, HOURLY_AT)  # j1's run now waits for the thread
    step(clock, HOURLY_AT + waited)
    blocker.release.set()
    if runs:  # the grace is inclusive
        late.wait_started(1)
        [succeeded] = recorder.wait_count("after_success", 1, job="j1")
        assert succeeded.started_at == HOURLY_AT + waited
        assert recorder.of("on_missed", "j1") == []
        return
    [missed] = recorder.wait_count("on_missed", 1, job="j1")
    assert (missed.scheduled_at, missed.outcome) == (HOURLY_AT, Outcome.MISSED)
    assert missed.detail == missed_detail(waited, timedelta(minutes=1))
    assert missed.started_at is None
    assert late.started == []
    # The job goes on: its next tick runs.
    step(clock, HOURLY_AT + timedelta(hours=1))
    late.wait_started(1)
    assert late.started == [HOURLY_AT + timedelta(hours=1)]


def test_a_run_missed_on_its_thread_does_not_use_up_max_runs(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    blocker, late = Gate(), Gate()
    late.release.set()
    s = make(clock=clock, listeners=[recorder], max_workers=1)
    s.add_job(every(seconds=10), blocker, name="j0")
    job = s.add_job(every(hours=1, anchor=HOURLY_AT), late, name="j1", misfire_grace=60, max_runs=1)
    step(clock, T[1])
    blocker.wait_started(1)
    step(clock, HOURLY_AT)
    step(clock, HOURLY_AT + timedelta(minutes=5))
    blocker.release.set()
    recorder.wait_count("on_missed", 1, job="j1")
    step(clock, HOURLY_AT + timedelta(hours=1))
    late.wait_started(1)  # its one run is still to come
    recorder.wait_count("after_success", 1, job="j1")
    assert job.next_run() is None  # then it is done


def test_a_run_timed_out_while_it_waited_for_a_thread_is_not_called(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    """Its timeout passes before a thread is free (and so does its grace): it is recorded
    timed out, as announced at the deadline, and its task is never called that late."""
    blocker, late = Gate(), Gate()
    late.release.set()
    state = MemoryState()
    s = make(clock=clock, listeners=[recorder], max_workers=1, backend=MemoryBackend(state))
    s.add_job(every(seconds=10), blocker, name="j0")
    s.add_job(every(hours=1, anchor=HOURLY_AT), late, name="j1", misfire_grace=60, timeout=120)
    step(clock, T[1])
    blocker.wait_started(1)
    step(clock, HOURLY_AT)
    step(clock, HOURLY_AT + timedelta(minutes=2))  # its deadline: on_timeout is told now
    recorder.wait_count("on_timeout", 1, job="j1")
    step(clock, HOURLY_AT + timedelta(minutes=5))
    blocker.release.set()
    recorder.wait_count("after_success", 1, job="j0")
    s.wait_idle()
    [record] = [r for r in state.history("j1") if r.scheduled_at == HOURLY_AT]
    assert record.outcome is Outcome.TIMED_OUT
    assert record.started_at is None
    assert record.error is not None
    assert "no worker thread was free" in record.error
    assert late.started == []
    assert recorder.of("on_missed", "j1") == []
    assert len(recorder.of("on_timeout", "j1")) == 1


@pytest.mark.parametrize("kind", ["memory", "embedded"])
def test_a_run_missed_on_its_thread_does_not_use_up_max_runs_while_the_job_ticks(
    make: Callable[..., Scheduler],
    clock: FakeClock,
    recorder: Recorder,
    tmp_path: Path,
    kind: str,
) -> None:
    backend = MemoryBackend() if kind == "memory" else EmbeddedBackend(tmp_path / "state")
    s = make(clock=clock, listeners=[recorder], max_workers=1, backend=backend)
    max_runs_while_ticking(s, clock, recorder, shared=kind != "memory")


def max_runs_while_ticking(
    s: Scheduler, clock: FakeClock, recorder: Recorder, *, shared: bool
) -> None:
    """The job's next tick comes while its first still waits for the thread (claimed and
    started, or on a shared backend left for a replica with a free thread): a count of its
    runs that includes the first must not retire the job once the first is missed."""
    blocker, late = Gate(), Gate()
    late.release.set()
    s.add_job(every(hours=1, anchor=T[1]), blocker, name="j0")
    anchor = T[1] + timedelta(seconds=1)
    job = s.add_job(every(seconds=10, anchor=anchor), late, name="j1", misfire_grace=5, max_runs=1)
    step(clock, T[1])
    blocker.wait_started(1)
    step(clock, anchor)  # j1's first tick waits for the thread
    step(clock, anchor + timedelta(seconds=10))  # its second comes meanwhile
    assert clock.wait_for_sleepers(1)  # and is answered
    blocker.release.set()
    [missed] = recorder.wait_count("on_missed", 1, job="j1")
    assert missed.scheduled_at == anchor
    s.wait_idle()
    # A shared backend left the second tick unclaimed, for when a thread is free: it runs.
    # The memory backend counted the first as a run when the second came: the third runs.
    runs_at = anchor + timedelta(seconds=10 if shared else 20)
    if not shared:
        step(clock, runs_at)
    late.wait_started(1)  # its one run
    recorder.wait_count("after_success", 1, job="j1")
    assert late.started == [runs_at]
    assert job.next_run() is None


def test_a_tick_deferred_for_capacity_is_missed_past_its_grace(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder, tmp_path: Path
) -> None:
    # On a shared backend a replica with no free thread leaves the tick for others, and
    # claims it once a thread frees up: by then it is too late.
    blocker, late = Gate(), Gate()
    backend = EmbeddedBackend(tmp_path / "state")
    s = make(clock=clock, listeners=[recorder], max_workers=1, backend=backend)
    s.add_job(every(seconds=10), blocker, name="j0")
    s.add_job(every(hours=1, anchor=HOURLY_AT), late, name="j1", misfire_grace=60)
    step(clock, T[1])
    blocker.wait_started(1)
    step(clock, HOURLY_AT)  # left for a replica with a free thread: none comes
    step(clock, HOURLY_AT + timedelta(minutes=5))
    blocker.release.set()
    [missed] = recorder.wait_count("on_missed", 1, job="j1")
    assert missed.detail == missed_detail(timedelta(minutes=5), timedelta(minutes=1))
    assert late.started == []


def test_a_tick_queued_behind_its_jobs_run_is_missed_past_its_grace(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gate = Gate()
    s = make(clock=clock, listeners=[recorder])
    s.add_job(every(seconds=10), gate, name="j", overlap="queue", misfire_grace=5)
    step(clock, T[1])
    gate.wait_started(1)
    step(clock, T[2])  # queued behind T[1]'s run
    step(clock, T[2] + timedelta(seconds=7))  # before T[3]
    gate.release.set()
    [missed] = recorder.wait_count("on_missed", 1, job="j")
    assert missed.scheduled_at == T[2]
    assert missed.detail == missed_detail(timedelta(seconds=7), timedelta(seconds=5))
    assert gate.started == [T[1]]
    step(clock, T[3])
    gate.wait_started(2)  # and the job goes on
    assert gate.started == [T[1], T[3]]


def test_a_tick_queued_behind_a_manual_run_is_missed_past_its_grace(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gate = Gate()
    s = make(clock=clock, listeners=[recorder])
    job = s.add_job(
        every(hours=1, anchor=HOURLY_AT), gate, name="j", overlap="queue", misfire_grace=60
    )
    job.run_now()  # holds the job's slot
    gate.wait_started(1)
    step(clock, HOURLY_AT)  # queued behind the manual run
    step(clock, HOURLY_AT + timedelta(minutes=5))
    gate.release.set()
    [missed] = recorder.wait_count("on_missed", 1, job="j")
    assert missed.scheduled_at == HOURLY_AT
    assert missed.detail == missed_detail(timedelta(minutes=5), timedelta(minutes=1))
    assert len(gate.started) == 1  # the manual run alone


def test_a_catch_up_tick_waiting_in_the_backlog_is_missed_past_its_grace(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    # Down from T[1] to T[4] + 1 s: T[2] is past the grace already, T[3] and T[4] are run one
    # after the other. T[3]'s run lasts until T[4] is 16 s old.
    state = MemoryState()
    first = make(clock=clock, backend=MemoryBackend(state))
    done = Gate()
    done.release.set()
    first.add_job(every(seconds=10), done, name="j")
    step(clock, T[1])
    done.wait_started(1)
    first.shutdown(timeout=5)
    clock.set(T[4] + timedelta(seconds=1))
    gate = Gate()
    s = make(clock=clock, listeners=[recorder], backend=MemoryBackend(state))
    s.add_job(every(seconds=10), gate, name="j", catch_up="all", misfire_grace=15)
    gate.wait_started(1)
    assert gate.started == [T[3]]
    step(clock, T[5] + timedelta(seconds=6))
    gate.release.set()
    missed = recorder.wait_count("on_missed", 2, job="j")
    assert {(e.scheduled_at, e.detail) for e in missed} == {
        (T[2], missed_detail(timedelta(seconds=21), timedelta(seconds=15))),
        (T[4], missed_detail(timedelta(seconds=16), timedelta(seconds=15))),
    }
    assert T[4] not in gate.started


def test_a_job_added_again_is_not_retired_by_the_last_run_of_the_one_it_replaced(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gate, other = Gate(), Gate()
    other.release.set()
    s = make(clock=clock, listeners=[recorder])
    s.add_job(every(seconds=10), gate, name="j", misfire_grace=5, max_runs=1)
    step(clock, T[1])
    gate.wait_started(1)  # its one run: the job retires once it has run
    s.remove_job("j")
    job = s.add_job(every(seconds=10), other, name="j", max_runs=3)
    gate.release.set()
    recorder.wait_count("after_success", 1, job="j")
    s.wait_idle()
    assert job.next_run() == T[2]
    step(clock, T[2])
    other.wait_started(1)
    assert other.started == [T[2]]
