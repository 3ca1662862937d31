"""The thread-facing Scheduler, driven by a FakeClock: runs, context, jobs, errors."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

import replicron
from replicron import (
    DuplicateJobError,
    InvalidJobArgumentsError,
    InvalidJobNameError,
    InvalidJobOptionError,
    JobNotFoundError,
    NoCurrentRunError,
    Outcome,
    Scheduler,
    SchedulerClosedError,
    cron,
    current_run,
    every,
    once,
)
from replicron.testing import FakeClock
from tests.helpers import START, Recorder, step, z


def noop() -> None:
    pass  # here, not imported: a job's default name is its task's module and name


def test_runs_each_tick_with_its_arguments_and_context(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: list[tuple[int, str, datetime, int | None, str, datetime | None]] = []

    def task(a: int, *, b: str) -> None:
        run = current_run()
        seen.append((a, b, run.scheduled_at, run.run_id, run.replica_id, run.deadline))

    scheduler.add_job(every(seconds=10), task, 1, b="x", name="t")
    for second in (10, 20, 30):
        step(clock, START + timedelta(seconds=second))
        recorder.wait_count("after_success", second // 10)
    assert seen == [
        (1, "x", START + timedelta(seconds=10), 1, "r1", None),
        (1, "x", START + timedelta(seconds=20), 2, "r1", None),
        (1, "x", START + timedelta(seconds=30), 3, "r1", None),
    ]
    events = recorder.of("after_success")
    assert [e.lateness for e in events] == [timedelta(0)] * 3
    assert len(recorder.of("before_run")) == 3
    assert scheduler.get_job("t").last_run == events[-1]
    assert events[-1].outcome is Outcome.SUCCEEDED


def test_async_function_runs_on_the_engine_loop(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def task() -> None:
        loops.append(asyncio.get_running_loop())
        assert current_run().job_name == "a"

    scheduler.add_job(cron("* * * * *"), task, name="a")
    step(clock, START + timedelta(minutes=1))
    recorder.wait_count("after_success", 1)
    assert len(loops) == 1
    assert recorder.outcomes() == [(START + timedelta(minutes=1), Outcome.SUCCEEDED)]


def test_current_run_outside_a_run() -> None:
    with pytest.raises(NoCurrentRunError):
        current_run()


def test_failure_is_recorded_logged_and_the_schedule_goes_on(
    scheduler: Scheduler,
    clock: FakeClock,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")

    caplog.set_level(logging.ERROR, logger="replicron")
    scheduler.add_job(every(seconds=5), flaky, name="flaky")
    step(clock, START + timedelta(seconds=5))
    failure = recorder.wait_count("after_failure", 1)[0]
    assert isinstance(failure.error, RuntimeError)
    step(clock, START + timedelta(seconds=10))
    recorder.wait_count("after_success", 1)
    assert recorder.outcomes("flaky") == [
        (START + timedelta(seconds=5), Outcome.FAILED),
        (START + timedelta(seconds=10), Outcome.SUCCEEDED),
    ]
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "failed"]
    assert record.exc_info is not None
    assert "boom" in str(record.exc_info[1])
    assert record.job == "flaky"  # type: ignore[attr-defined]
    assert record.tick == (START + timedelta(seconds=5)).isoformat()  # type: ignore[attr-defined]
    assert record.replica == "r1"  # type: ignore[attr-defined]


def test_a_failing_listener_is_logged_and_changes_nothing(
    clock: FakeClock, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(replicron.Listener):
        def before_run(self, event: replicron.RunEvent) -> None:
            raise ValueError("listener bug")

        async def after_success(self, event: replicron.RunEvent) -> None:
            raise ValueError("async listener bug")

    caplog.set_level(logging.ERROR, logger="replicron")
    with Scheduler(clock=clock, listeners=[Broken(), recorder]) as s:
        s.add_job(every(seconds=1), noop, name="n")
        step(clock, START + timedelta(seconds=1))
        recorder.wait_count("after_success", 1)
        step(clock, START + timedelta(seconds=2))
        recorder.wait_count("after_success", 2)
    messages = [r.getMessage() for r in caplog.records if r.event == "listener_failed"]  # type: ignore[attr-defined]
    assert any("listener bug" in m for m in messages)
    assert any("async listener bug" in m for m in messages)


def test_registration_errors_name_the_job(scheduler: Scheduler) -> None:
    def task(a: int, b: int = 2) -> None:
        pass

    with pytest.raises(InvalidJobArgumentsError, match="job 'sum': arguments do not fit") as info:
        scheduler.add_job(every(seconds=1), task, name="sum")
    assert isinstance(info.value, TypeError)
    with pytest.raises(InvalidJobArgumentsError, match="unexpected keyword argument 'c'"):
        scheduler.add_job(every(seconds=1), task, 1, c=3, name="sum")
    with pytest.raises(InvalidJobNameError, match="pass name="):
        scheduler.add_job(every(seconds=1), lambda: None)
    with pytest.raises(InvalidJobOptionError, match="job 'x': overlap must be one of"):
        scheduler.add_job(every(seconds=1), noop, name="x", overlap="sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobOptionError, match="job 'x': catch_up"):
        scheduler.add_job(every(seconds=1), noop, name="x", catch_up="some")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobOptionError, match="job 'x': max_runs"):
        scheduler.add_job(every(seconds=1), noop, name="x", max_runs=0)
    with pytest.raises(InvalidJobOptionError, match="job 'x': timeout must be positive"):
        scheduler.add_job(every(seconds=1), noop, name="x", timeout=0)
    with pytest.raises(InvalidJobOptionError, match="job 'x': trigger must be a trigger"):
        scheduler.add_job("*/5 * * * *", noop, name="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobOptionError, match="job 'x': stop_at"):
        scheduler.add_job(every(seconds=1), noop, name="x", start_at=START, stop_at=START)
    with pytest.raises(InvalidJobOptionError, match=r"job 'x': start_at .* no time zone"):
        scheduler.add_job(every(seconds=1), noop, name="x", start_at=datetime(2026, 1, 1))
    with pytest.raises(InvalidJobOptionError, match="job 'x': tags"):
        scheduler.add_job(every(seconds=1), noop, name="x", tags=["ok", ""])
    with pytest.raises(InvalidJobOptionError, match="must be callable"):
        scheduler.add_job(every(seconds=1), "noop", name="x")  # type: ignore[arg-type]
    scheduler.add_job(every(seconds=1), task, 1, name="sum")
    with pytest.raises(DuplicateJobError, match="'sum' is already registered"):
        scheduler.add_job(every(seconds=1), task, 1, name="sum")
    assert [j.name for j in scheduler.jobs()] == ["sum"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_concurrent_jobs": 0}, "max_concurrent_jobs"),
        ({"concurrency_mode": "drop"}, "concurrency_mode"),
        ({"max_workers": 0}, "max_workers"),
        ({"stop_timeout": -1}, "stop_timeout"),
        ({"listeners": [object()]}, "listeners"),
        ({"defer_gc": "yes"}, "defer_gc"),
        ({"stop_timeout": float("nan")}, "stop_timeout must be a finite number"),
        ({"stop_timeout": float("inf")}, "stop_timeout must be a finite number"),
        ({"clock": time}, "clock must be a replicron Clock"),
        ({"replica_id": 5}, "replica_id must be a non-empty string"),
        ({"replica_id": "  "}, "replica_id must be a non-empty string"),
        ({"replica_id": "r\x001"}, r"replica_id 'r\\x001' contains control characters"),
        ({"replica_id": "r\n1"}, r"replica_id 'r\\n1' contains control characters"),
    ],
)
def test_bad_scheduler_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobOptionError, match=message):
        Scheduler(**options)
    with pytest.raises(replicron.InvalidTimezoneError):
        Scheduler(timezone="Nowhere/Land")


def test_default_names_decorator_and_job_handles(scheduler: Scheduler, clock: FakeClock) -> None:
    job = scheduler.add_job(cron("0 * * * *"), noop)
    assert job.name == "tests.unit.test_scheduler.noop"

    @scheduler.job(every(minutes=30), tags=["reports", "hourly"])
    def report() -> None:
        pass

    assert report.__name__ == "report"  # the decorator returns the function unchanged
    name = "tests.unit.test_scheduler.test_default_names_decorator_and_job_handles.<locals>.report"
    handle = scheduler.get_job(name)
    assert handle.tags == {"reports", "hourly"}
    assert handle.next_runs(3) == [
        START + timedelta(minutes=30),
        START + timedelta(minutes=60),
        START + timedelta(minutes=90),
    ]
    assert job.next_run() == START + timedelta(hours=1)
    assert scheduler.remove_by_tag("reports") == [name]
    with pytest.raises(JobNotFoundError):
        scheduler.get_job(name)
    job.remove()
    assert scheduler.jobs() == []
    with pytest.raises(JobNotFoundError):
        scheduler.remove_job("nope")
    with pytest.raises(JobNotFoundError):
        job.next_run()


def test_scheduler_timezone_applies_to_wall_clock_triggers(clock: FakeClock) -> None:
    with Scheduler(clock=clock, timezone="Europe/Kyiv") as s:
        local = s.add_job(cron("0 9 * * *"), noop, name="local")
        pinned = s.add_job(cron("0 9 * * *", tz="UTC"), noop, name="pinned")
        assert local.next_run() == z(2026, 1, 1, 7)
        assert pinned.next_run() == z(2026, 1, 1, 9)


def test_update_replans_and_validates(scheduler: Scheduler) -> None:
    job = scheduler.add_job(every(minutes=10), noop, name="u")
    assert job.next_run() == START + timedelta(minutes=10)
    job.update(every(minutes=3))
    assert job.next_run() == START + timedelta(minutes=3)
    job.update(start_at=START + timedelta(hours=1))
    assert job.next_run() == START + timedelta(hours=1)
    assert job.spec.start_at == START + timedelta(hours=1)
    with pytest.raises(InvalidJobOptionError, match="cannot update colour"):
        job.update(colour="red")
    with pytest.raises(InvalidJobOptionError, match="overlap"):
        job.update(overlap="never")
    assert job.spec.overlap == "skip"


def test_run_now_runs_an_extra_tick_at_the_current_time(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    job = scheduler.add_job(cron("0 0 1 1 *"), noop, name="yearly")
    clock.set(START + timedelta(minutes=5))
    job.run_now()
    recorder.wait_count("after_success", 1)
    assert recorder.outcomes() == [(START + timedelta(minutes=5), Outcome.SUCCEEDED)]
    assert job.next_run() == z(2027, 1, 1)


def test_late_wake_up_runs_only_the_latest_tick_and_records_the_rest_missed(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    scheduler.add_job(every(seconds=10), noop, name="m")
    step(clock, START + timedelta(seconds=35))
    recorder.wait_count("after_success", 1)
    assert recorder.outcomes() == [
        (START + timedelta(seconds=10), Outcome.MISSED),
        (START + timedelta(seconds=20), Outcome.MISSED),
        (START + timedelta(seconds=30), Outcome.SUCCEEDED),
    ]
    assert recorder.of("after_success")[0].lateness == timedelta(seconds=5)


def test_jobs_changed_shortly_before_their_instant(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    # Within 10 s of an instant the engine plans it ahead (20 ms after it is idle, real
    # time): whether it has by the time of the changes, they must take effect the same.
    for name in ("kept", "removed", "moved"):
        scheduler.add_job(every(seconds=10), noop, name=name)
    first = START + timedelta(seconds=10)
    step(clock, first - timedelta(seconds=5))
    scheduler.wait_idle()
    scheduler.remove_job("removed")
    scheduler.get_job("moved").update(every(seconds=20))
    assert scheduler.get_job("kept").next_runs(2) == [first, first + timedelta(seconds=10)]
    assert scheduler.get_job("moved").next_run() == START + timedelta(seconds=20)
    step(clock, first)
    scheduler.wait_idle()
    assert recorder.outcomes() == [(first, Outcome.SUCCEEDED)]
    assert [e.job for e in recorder.of("after_success")] == ["kept"]
    step(clock, START + timedelta(seconds=20))
    scheduler.wait_idle()
    assert sorted(e.job for e in recorder.of("after_success")) == ["kept", "kept", "moved"]


def test_start_stop_and_max_runs(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    scheduler.add_job(
        every(seconds=10),
        noop,
        name="window",
        start_at=START + timedelta(seconds=20),
        stop_at=START + timedelta(seconds=40),
    )
    limited = scheduler.add_job(every(seconds=10), noop, name="limited", max_runs=2)
    for second, successes in ((10, 1), (20, 3), (30, 4)):
        step(clock, START + timedelta(seconds=second))
        recorder.wait_count("after_success", successes)
    # Nothing is planned any more, so the engine waits for a job change, not for the clock.
    assert clock.next_deadline() is None
    clock.set(START + timedelta(minutes=5))
    assert [t for t, _ in recorder.outcomes("window")] == [
        START + timedelta(seconds=20),
        START + timedelta(seconds=30),
    ]
    assert [t for t, _ in recorder.outcomes("limited")] == [
        START + timedelta(seconds=10),
        START + timedelta(seconds=20),
    ]
    assert limited.next_run() is None
    assert scheduler.get_job("window").next_run() is None


def test_one_time_job(scheduler: Scheduler, clock: FakeClock, recorder: Recorder) -> None:
    at = START + timedelta(hours=2)
    job = scheduler.add_job(once(at, now=START), noop, name="once")
    step(clock, at + timedelta(minutes=1))
    recorder.wait_count("after_success", 1)
    assert recorder.outcomes() == [(at, Outcome.SUCCEEDED)]
    assert job.next_run() is None


def test_shutdown_is_idempotent_and_final(clock: FakeClock, recorder: Recorder) -> None:
    s = Scheduler(clock=clock, listeners=[recorder])
    s.start()
    s.add_job(every(seconds=1), noop, name="n")
    step(clock, START + timedelta(seconds=1))
    recorder.wait_count("after_success", 1)
    s.shutdown()
    s.shutdown()
    assert not s.running
    clock.advance(timedelta(hours=1))
    assert len(recorder.of("after_success")) == 1
    with pytest.raises(SchedulerClosedError):
        s.add_job(every(seconds=1), noop, name="late")
    with pytest.raises(SchedulerClosedError):
        s.start()


def test_shutdown_before_start_and_context_manager(clock: FakeClock) -> None:
    s = Scheduler(clock=clock)
    s.shutdown()
    with pytest.raises(SchedulerClosedError):
        s.start()
    with Scheduler(clock=clock) as t:
        assert t.running
    assert not t.running


def test_shutdown_waits_for_a_running_task(clock: FakeClock, recorder: Recorder) -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(10)

    s = Scheduler(clock=clock, listeners=[recorder])
    s.start()
    s.add_job(every(seconds=1), slow, name="slow")
    step(clock, START + timedelta(seconds=1))
    assert started.wait(10)
    done = threading.Event()

    def stop() -> None:
        s.shutdown()
        done.set()

    stopper = threading.Thread(target=stop)
    stopper.start()
    assert not done.wait(0.2)  # still waiting for the task
    release.set()
    stopper.join(10)
    assert done.is_set()
    assert recorder.outcomes() == [(START + timedelta(seconds=1), Outcome.SUCCEEDED)]


def test_shutdown_timeout_signals_sync_and_cancels_async_runs(
    clock: FakeClock, recorder: Recorder
) -> None:
    seen_cancel = threading.Event()
    async_cancelled = threading.Event()
    sync_started = threading.Event()

    def stubborn() -> None:
        sync_started.set()
        current_run().cancelled.wait(10)
        seen_cancel.set()

    async def sleeper() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            async_cancelled.set()
            raise

    s = Scheduler(clock=clock, listeners=[recorder], stop_timeout=0.05)
    s.start()
    s.add_job(every(seconds=1), stubborn, name="sync")
    s.add_job(every(seconds=1), sleeper, name="async")
    step(clock, START + timedelta(seconds=1))
    recorder.wait_count("before_run", 2)
    assert sync_started.wait(10)  # on its thread: a run cut off before that is not called
    s.shutdown()
    assert seen_cancel.is_set()
    assert async_cancelled.is_set()
    assert sorted(recorder.outcomes(), key=str) == [
        (START + timedelta(seconds=1), Outcome.ABANDONED),
        (START + timedelta(seconds=1), Outcome.ABANDONED),
    ]


def test_forked_child_refuses_to_use_a_started_scheduler(scheduler: Scheduler) -> None:
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what add_job raised, then leave at once
        try:
            scheduler.add_job(every(seconds=1), noop, name="child")
            message = "no error"
        except replicron.ForkedSchedulerError as exc:
            message = str(exc)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        reported = pipe.read().decode()
    os.waitpid(pid, 0)
    assert "cannot be used in forked process" in reported
    assert "start schedulers after forking" in reported


def test_a_job_that_could_never_run_is_refused(scheduler: Scheduler, clock: FakeClock) -> None:
    clock.set(START + timedelta(hours=1))
    with pytest.raises(replicron.PastInstantError, match="job 'late': every one-time instant"):
        scheduler.add_job(once(START + timedelta(minutes=30), now=START), noop, name="late")
    with pytest.raises(InvalidJobOptionError, match=r"would never run.*before stop_at"):
        scheduler.add_job(every(seconds=1), noop, name="over", stop_at=START)
    assert scheduler.jobs() == []
    job = scheduler.add_job(every(seconds=1), noop, name="ok")
    with pytest.raises(InvalidJobOptionError, match="would never run"):
        job.update(stop_at=START)
    assert job.spec.stop_at is None
    assert job.next_run() == START + timedelta(hours=1, seconds=1)


def test_start_at_anchors_interval_jobs_built_without_an_anchor(scheduler: Scheduler) -> None:
    start = START + timedelta(minutes=7, seconds=3)
    floating = scheduler.add_job(every(minutes=5), noop, name="floating", start_at=start)
    assert floating.next_runs(2) == [start, start + timedelta(minutes=5)]
    pinned_anchor = START + timedelta(seconds=1)
    pinned = scheduler.add_job(
        every(minutes=5, anchor=pinned_anchor), noop, name="pinned", start_at=start
    )
    assert pinned.next_runs(2) == [
        pinned_anchor + timedelta(minutes=10),
        pinned_anchor + timedelta(minutes=15),
    ]


def _generator() -> Iterator[None]:
    yield None


async def _async_generator() -> AsyncIterator[None]:
    yield None


@pytest.mark.parametrize(
    ("func", "options", "message"),
    [
        (noop, {"timeout": float("nan")}, "job 'x': timeout must be a finite number"),
        (noop, {"timeout": float("inf")}, "job 'x': timeout must be a finite number"),
        (noop, {"timeout": 1e20}, "job 'x': timeout of 1e\\+20 seconds is longer"),
        (noop, {"timeout": True}, "job 'x': timeout must be a timedelta or a number"),
        (noop, {"misfire_grace": float("nan")}, "job 'x': misfire_grace must be a finite"),
        (noop, {"misfire_grace": -1}, "job 'x': misfire_grace must be positive"),
        (noop, {"tags": 5}, "job 'x': tags must be a string or strings"),
        (noop, {"tags": [5]}, "job 'x': tags must be non-empty strings"),
        (_generator, {}, "job 'x': _generator is a generator function"),
        (_async_generator, {}, "job 'x': _async_generator is an async generator function"),
    ],
)
def test_bad_job_input_fails_at_registration_naming_job_and_field(
    scheduler: Scheduler, func: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidJobOptionError, match=message):
        scheduler.add_job(every(seconds=1), func, name="x", **options)
    assert scheduler.jobs() == []  # nothing was registered


def test_both_faces_take_the_same_typed_options_and_nothing_else() -> None:
    import inspect

    threaded = inspect.signature(Scheduler).parameters
    asyncio_face = inspect.signature(replicron.AsyncScheduler).parameters
    assert threaded == asyncio_face
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in threaded.values())
    assert "timezone" in threaded
    with pytest.raises(TypeError, match="timezon"):
        Scheduler(timezon="UTC")  # type: ignore[call-arg]
