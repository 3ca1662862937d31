"""Overlap policies, the concurrency limit, timeouts, replicas sharing a backend, catch-up."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from replicron import (
    MemoryBackend,
    MemoryState,
    Outcome,
    Scheduler,
    cron,
    current_run,
    every,
)
from replicron._engine.planner import CatchUp
from replicron.backends import RunRecord
from replicron.testing import FakeClock
from tests.helpers import START, FlakyBackend, Gate, Recorder, step

T = [START + timedelta(seconds=10 * k) for k in range(20)]  # T[k]: tick k of every(10 s)


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


def test_overlap_skip(make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder) -> None:
    gate = Gate()
    make(clock=clock, listeners=[recorder]).add_job(every(seconds=10), gate, name="g")
    step(clock, T[1])
    gate.wait_started(1)
    step(clock, T[2])
    recorder.wait_count("on_skipped", 1)
    gate.release.set()
    recorder.wait_count("after_success", 1)
    step(clock, T[3])
    recorder.wait_count("after_success", 2)
    assert recorder.outcomes() == [
        (T[2], Outcome.SKIPPED_OVERLAP),
        (T[1], Outcome.SUCCEEDED),
        (T[3], Outcome.SUCCEEDED),
    ]
    assert gate.max_running == 1


def test_overlap_queue_keeps_one_waiting_tick(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gate = Gate()
    s = make(clock=clock, listeners=[recorder])
    s.add_job(every(seconds=10), gate, name="q", overlap="queue")
    step(clock, T[1])
    gate.wait_started(1)
    step(clock, T[2])  # queued
    step(clock, T[3])  # replaces T[2], which is missed
    recorder.wait_count("on_missed", 1)
    gate.release.set()
    gate.wait_started(2)
    recorder.wait_count("after_success", 2)
    assert gate.started == [T[1], T[3]]
    assert recorder.outcomes() == [
        (T[2], Outcome.MISSED),
        (T[1], Outcome.SUCCEEDED),
        (T[3], Outcome.SUCCEEDED),
    ]
    assert gate.max_running == 1


def test_overlap_allow_runs_concurrently(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gate = Gate()
    make(clock=clock, listeners=[recorder]).add_job(
        every(seconds=10), gate, name="a", overlap="allow"
    )
    step(clock, T[1])
    gate.wait_started(1)
    step(clock, T[2])
    gate.wait_started(2)
    assert gate.max_running == 2
    gate.release.set()
    recorder.wait_count("after_success", 2)


def test_concurrency_limit_queue(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gates = [Gate() for _ in range(3)]
    s = make(clock=clock, listeners=[recorder], max_concurrent_jobs=2)
    for i, gate in enumerate(gates):
        s.add_job(every(seconds=10), gate, name=f"j{i}")
    step(clock, T[1])
    gates[0].wait_started(1)
    gates[1].wait_started(1)
    assert gates[2].started == []
    gates[0].release.set()
    gates[2].wait_started(1)  # started once a slot was free
    assert gates[2].started == [T[1]]
    gates[1].release.set()
    gates[2].release.set()
    recorder.wait_count("after_success", 3)


def test_concurrency_limit_skip(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    gates = [Gate() for _ in range(3)]
    s = make(clock=clock, listeners=[recorder], max_concurrent_jobs=2, concurrency_mode="skip")
    for i, gate in enumerate(gates):
        s.add_job(every(seconds=10), gate, name=f"j{i}")
    step(clock, T[1])
    skipped = recorder.wait_count("on_skipped", 1)
    assert [(e.job, e.outcome) for e in skipped] == [("j2", Outcome.SKIPPED_LIMIT)]
    for gate in gates:
        gate.release.set()
    recorder.wait_count("after_success", 2)


def test_timeout_cancels_async_runs(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    s = make(clock=clock, listeners=[recorder])
    job = s.add_job(every(seconds=10), hang, name="h", timeout=timedelta(seconds=3))
    step(clock, T[1])
    recorder.wait_count("before_run", 1)
    step(clock, T[1] + timedelta(seconds=3))
    recorder.wait_count("on_timeout", 1)
    assert cancelled.wait(10)
    s.wait_idle()
    assert job.last_run is not None
    assert job.last_run.outcome is Outcome.TIMED_OUT
    assert recorder.outcomes() == [(T[1], Outcome.TIMED_OUT)]


def test_timeout_signals_sync_runs_through_the_cancel_event(
    make: Callable[..., Scheduler],
    clock: FakeClock,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[datetime | None] = []
    started = threading.Event()

    def polite() -> None:
        run = current_run()
        seen.append(run.deadline)
        started.set()
        assert run.cancelled.wait(10)

    caplog.set_level(logging.INFO, logger="replicron")
    s = make(clock=clock, listeners=[recorder])
    job = s.add_job(every(seconds=10), polite, name="p", timeout=2.5)
    step(clock, T[1])
    assert started.wait(10)  # on its thread: a run cut off before that is not called
    step(clock, T[1] + timedelta(seconds=4))
    recorder.wait_count("on_timeout", 1)
    s.wait_idle()
    assert seen == [T[1] + timedelta(seconds=2.5)]
    assert job.last_run is not None
    assert job.last_run.outcome is Outcome.TIMED_OUT
    # One WARNING for one event (the deadline); the outcome, when the task returns, is noted
    # with how long after the deadline that was.
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.event, r.getMessage().split(": ")[-1]) for r in warned] == [  # type: ignore[attr-defined]
        ("timed_out", "run passed its timeout of 0:00:02.500000; signalled (cancel event set)")
    ]
    [noted] = [r for r in caplog.records if r.levelno == logging.INFO and r.event == "timed_out"]  # type: ignore[attr-defined]
    assert noted.getMessage().endswith("the sync task returned 0:00:01.500000 after it")
    assert len(recorder.of("on_timeout")) == 1  # not told again when the task returned


def test_replicas_sharing_a_backend_run_each_tick_once(clock: FakeClock) -> None:
    state = MemoryState()
    recorders = [Recorder() for _ in range(3)]
    ran: list[tuple[str, datetime]] = []
    lock = threading.Lock()

    def task() -> None:
        run = current_run()
        with lock:
            ran.append((run.replica_id, run.scheduled_at))

    replicas = [
        Scheduler(clock=clock, backend=MemoryBackend(state), replica_id=f"r{i}", listeners=[rec])
        for i, rec in enumerate(recorders)
    ]
    for replica in replicas:
        replica.start()
        replica.add_job(every(seconds=10), task, name="shared")
    try:
        for k in range(1, 6):
            clock.set(T[k])
            for replica in replicas:  # every replica has handled the tick and its release
                replica.wait_idle()
    finally:
        for replica in replicas:
            replica.shutdown()
    ticks = [t for _, t in ran]
    assert sorted(ticks) == T[1:6]
    assert len({r for r, _ in ran}) >= 1
    assert state.locks_held() == {}
    history = state.history("shared")
    assert sorted(r.scheduled_at for r in history) == T[1:6]
    assert [r.run_id for r in sorted(history, key=lambda r: r.scheduled_at)] == [1, 2, 3, 4, 5]


def down_for_ticks_2_to_4(clock: FakeClock) -> MemoryState:
    """The state of a replica that ran tick 1 of job "c" (every 10 s) and stopped; the clock
    set 5 s past tick 4, so ticks 2, 3 and 4 fell due while no replica was up."""
    state = MemoryState()
    first = Recorder()
    with Scheduler(clock=clock, backend=MemoryBackend(state), listeners=[first]) as s:
        s.add_job(every(seconds=10), lambda: None, name="c")
        step(clock, T[1])
        first.wait_count("after_success", 1)
    clock.set(T[4] + timedelta(seconds=5))
    return state


def test_restart_catches_up_the_latest_missed_tick(clock: FakeClock) -> None:
    state = down_for_ticks_2_to_4(clock)
    second = Recorder()
    with Scheduler(clock=clock, backend=MemoryBackend(state), listeners=[second]) as s:
        s.add_job(every(seconds=10), lambda: None, name="c")
        second.wait_count("after_success", 1)
        assert second.outcomes() == [
            (T[2], Outcome.MISSED),
            (T[3], Outcome.MISSED),
            (T[4], Outcome.SUCCEEDED),
        ]


@pytest.mark.parametrize(
    ("policy", "grace", "expected"),
    [
        ("none", None, [Outcome.MISSED, Outcome.MISSED, Outcome.MISSED]),
        ("all", None, [Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.SUCCEEDED]),
        ("latest", timedelta(seconds=2), [Outcome.MISSED, Outcome.MISSED, Outcome.MISSED]),
    ],
)
def test_catch_up_policies(
    clock: FakeClock, policy: CatchUp, grace: timedelta | None, expected: list[Outcome]
) -> None:
    state = down_for_ticks_2_to_4(clock)
    recorder = Recorder()
    with Scheduler(clock=clock, backend=MemoryBackend(state), listeners=[recorder]) as s:
        s.add_job(every(seconds=10), lambda: None, name="c", catch_up=policy, misfire_grace=grace)
        recorder.wait(lambda r: len(r.outcomes()) >= 3)
    assert sorted(recorder.outcomes()) == list(zip(T[2:5], expected, strict=True))


def test_a_backend_failure_is_reported_and_the_schedule_goes_on(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    """Ticks whose claim or miss record failed are not dropped: once the backend answers
    they are handled like ticks missed while no replica was up (here superseded by a later
    due tick each time, so recorded missed)."""
    s = make(clock=clock, listeners=[recorder], backend=FlakyBackend())
    s.add_job(every(seconds=10), lambda: None, name="f")
    clock.set(T[1])
    s.wait_idle()
    [error] = recorder.of("on_lock_error")
    assert (error.job, error.scheduled_at) == ("f", T[1])
    assert isinstance(error.error, ConnectionError)
    assert recorder.outcomes() == []
    clock.set(T[3] + timedelta(seconds=1))  # T[2] is missed; recording T[1] missed fails once
    s.wait_idle()
    assert sorted(recorder.outcomes()) == [(T[2], Outcome.MISSED), (T[3], Outcome.SUCCEEDED)]
    assert [e.scheduled_at for e in recorder.of("on_lock_error")] == [T[1], T[1]]
    clock.set(T[4])
    s.wait_idle()
    assert sorted(recorder.outcomes()) == [
        (T[1], Outcome.MISSED),
        (T[2], Outcome.MISSED),
        (T[3], Outcome.SUCCEEDED),
        (T[4], Outcome.SUCCEEDED),
    ]


def test_a_tick_whose_claim_failed_runs_once_the_backend_answers(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    s = make(clock=clock, listeners=[recorder], backend=FlakyBackend(fail_claims=3))
    s.add_job(every(seconds=10), lambda: None, name="f")
    clock.set(T[1])
    s.wait_idle()
    for retry in (1, 2, 3):  # tried again every second until the backend answers
        assert recorder.outcomes() == []
        assert clock.next_deadline() == T[1] + timedelta(seconds=retry)
        clock.set(T[1] + timedelta(seconds=retry))
        s.wait_idle()
    assert recorder.outcomes() == [(T[1], Outcome.SUCCEEDED)]  # run late, not dropped
    assert len(recorder.of("on_lock_error")) == 3


def test_a_manual_run_whose_claim_failed_is_asked_for_again_at_its_instant(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    s = make(clock=clock, listeners=[recorder], backend=FlakyBackend(fail_claims=2))
    job = s.add_job(cron("0 0 1 7 *"), lambda: None, name="yearly", misfire_grace=1)
    # The step that adding the job wakes must be over: a step under way as run_now() asks
    # would claim the run, and the wake-up run_now() sends would claim it again, at once.
    s.wait_idle()
    asked_at = clock.now()
    job.run_now()
    s.wait_idle()
    for retry in (1, 2):
        assert recorder.outcomes() == []
        clock.set(asked_at + timedelta(seconds=retry))
        s.wait_idle()
    # The same instant each try: a claim committed but unheard is then recognised as ours.
    # Started 2 s after it was asked for, past misfire_grace, which is for ticks only.
    [ran] = recorder.of("after_success")
    assert (ran.scheduled_at, ran.manual) == (asked_at, True)
    assert len(recorder.of("on_lock_error")) == 2


class AheadOfTheBackend(MemoryBackend):
    """The in-process backend answering, once, that the ticks to write off are not yet due by
    its clock (as PostgreSQL does for a replica whose clock runs ahead)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[datetime] = []

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        if not self.refused:
            self.refused = [r.scheduled_at for r in records]
            return [None] * len(records)
        return await super().record_unclaimed(records)


def test_a_tick_the_backend_says_is_not_yet_due_is_claimed_again_not_written_off(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    backend = AheadOfTheBackend()
    s = make(clock=clock, listeners=[recorder], backend=backend)
    s.add_job(every(seconds=10), lambda: None, name="f")
    clock.set(T[2])  # T[1] is coalesced into T[2]: the backend refuses to write it off
    s.wait_idle()
    assert backend.refused == [T[1]]
    assert clock.next_deadline() == T[2] + timedelta(milliseconds=100)
    clock.set(T[2] + timedelta(milliseconds=100))
    s.wait_idle()
    assert sorted(recorder.outcomes()) == [(T[1], Outcome.SUCCEEDED), (T[2], Outcome.SUCCEEDED)]


def test_ticks_still_unhandled_at_shutdown_are_recorded_missed(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    s = make(clock=clock, listeners=[recorder], backend=FlakyBackend(fail_records=0))
    s.add_job(every(seconds=10), lambda: None, name="f")
    clock.set(T[1])  # its claim fails; the retry would come a second later
    s.wait_idle()
    assert recorder.outcomes() == []
    s.shutdown()
    assert recorder.outcomes() == [(T[1], Outcome.MISSED)]
    [missed] = recorder.of("on_missed")
    assert "scheduler shut down" in (missed.detail or "")


def test_shutdown_without_waiting_names_only_runs_that_ignore_cancellation(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    started = threading.Barrier(3)

    def polite() -> None:
        started.wait(10)
        current_run().cancelled.wait(10)  # honours the cancel event at once

    async def stubborn() -> None:
        started.wait(10)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(2)  # goes on after being cancelled (for a while)

    caplog.set_level(logging.INFO, logger="replicron")
    s = Scheduler(clock=clock)
    s.add_job(every(seconds=10), polite, name="polite")
    s.add_job(every(seconds=10), stubborn, name="stubborn")
    s.start()
    step(clock, T[1])
    started.wait(10)
    begun = time.monotonic()
    s.shutdown(wait=False)
    took = time.monotonic() - begun
    named = [
        (r.event, r.job)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", None) in ("worker_stuck", "run_ignores_cancellation")
    ]
    assert named == [("run_ignores_cancellation", "stubborn")]  # not the polite sync run
    assert took < 1.9  # it did not wait for the stubborn run's 2 s


def test_misfire_grace_applies_to_every_start_not_only_at_catch_up(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder
) -> None:
    # j1's tick waits for a slot behind j0's run; by the time it frees, the tick is 5 minutes
    # old, past j1's misfire_grace of a minute.
    blocker, late = Gate(), Gate()
    tick = T[1] + timedelta(seconds=1)
    s = make(clock=clock, listeners=[recorder], max_concurrent_jobs=1)
    s.add_job(every(seconds=10), blocker, name="j0")
    s.add_job(every(hours=1, anchor=tick), late, name="j1", misfire_grace=60)
    step(clock, T[1])
    blocker.wait_started(1)
    step(clock, tick)  # claimed, and waiting for the slot
    step(clock, tick + timedelta(minutes=5))
    blocker.release.set()
    [missed] = recorder.wait_count("on_missed", 1, job="j1")
    assert missed.scheduled_at == tick
    assert missed.detail == (
        "it would have started 0:05:00 after its tick, past misfire_grace 0:01:00"
    )
    assert late.started == []  # it never ran
