"""What services and the daemon change on a running scheduler: a job's task replaced in place,
the stop timeout, a shutdown cut short, and why a run was told to stop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest

from replicron import (
    AsyncScheduler,
    CancelReason,
    InvalidJobArgumentsError,
    InvalidJobOptionError,
    MemoryBackend,
    Outcome,
    RunContext,
    Scheduler,
    current_run,
    every,
)
from replicron.testing import FakeClock
from tests.helpers import START, Recorder, poll_until, step


class LosingBackend(MemoryBackend):
    """The memory backend, with a way for a test to tell the scheduler that locks were lost
    (as the PostgreSQL backend does when its session dies)."""

    _lost: Callable[[Sequence[int]], None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        self._lost, self._loop = on_lock_lost, asyncio.get_running_loop()
        await super().open(replica_id, on_lock_lost)

    def lose(self, run_id: int | None) -> None:
        """From any thread: the lock of run ``run_id`` was lost."""
        lost, loop = self._lost, self._loop
        assert lost is not None
        assert loop is not None
        assert run_id is not None
        loop.call_soon_threadsafe(lost, [run_id])


def tick(clock: FakeClock, seconds: float) -> None:
    step(clock, START + timedelta(seconds=seconds))


def test_update_replaces_the_task_and_its_arguments(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    seen: list[tuple[str, object, object]] = []

    def first(region: str) -> None:
        seen.append(("first", region, None))

    def second(region: str, *, size: int) -> None:
        seen.append(("second", region, size))

    job = scheduler.add_job(every(seconds=10), first, "eu", name="refresh")
    tick(clock, 10)
    recorder.wait_count("after_success", 1)
    job.update(func=second, kwargs={"size": 3})  # the positional "eu" is kept
    tick(clock, 20)
    recorder.wait_count("after_success", 2)
    job.update(args=["us"])
    tick(clock, 30)
    recorder.wait_count("after_success", 3)
    assert seen == [("first", "eu", None), ("second", "eu", 3), ("second", "us", 3)]
    assert (job.spec.func, job.spec.args, job.spec.kwargs) == (second, ("us",), {"size": 3})


def test_an_update_whose_task_does_not_bind_changes_nothing(scheduler: Scheduler) -> None:
    def task(region: str) -> None:
        pass

    job = scheduler.add_job(every(seconds=10), task, "eu", name="refresh")
    with pytest.raises(InvalidJobArgumentsError, match="job 'refresh'"):
        job.update(args=("eu", "us"))
    with pytest.raises(InvalidJobArgumentsError, match="job 'refresh': args must be a list"):
        job.update(args="eu")  # would be ("e", "u") if taken apart
    with pytest.raises(InvalidJobArgumentsError, match="job 'refresh': kwargs must be a mapping"):
        job.update(kwargs=[("region", "eu")])  # type: ignore[arg-type]
    with pytest.raises(InvalidJobOptionError, match="callable"):
        job.update(func="task")  # type: ignore[arg-type]
    assert (job.spec.func, job.spec.args, job.spec.kwargs) == (task, ("eu",), {})


def test_a_run_going_on_still_counts_for_overlap_after_its_task_is_replaced(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    release = threading.Event()

    def slow() -> None:
        release.wait(10)

    job = scheduler.add_job(every(seconds=10), slow, name="slow")
    tick(clock, 10)
    recorder.wait_count("before_run", 1)
    job.update(func=lambda: None)
    tick(clock, 20)
    recorder.wait_count("on_skipped", 1)
    release.set()
    recorder.wait_count("after_success", 1)
    assert recorder.outcomes() == [
        (START + timedelta(seconds=20), Outcome.SKIPPED_OVERLAP),
        (START + timedelta(seconds=10), Outcome.SUCCEEDED),
    ]


def test_the_stop_timeout_can_be_changed_and_is_checked() -> None:
    s = Scheduler(stop_timeout=5)
    assert s.stop_timeout == 5.0
    s.stop_timeout = 0.5
    assert s.stop_timeout == 0.5
    for bad in (-1, float("inf"), True, "5"):
        with pytest.raises(InvalidJobOptionError, match="stop_timeout"):
            s.stop_timeout = bad  # type: ignore[assignment]
    assert s.stop_timeout == 0.5


def test_a_stop_that_waits_is_cut_short_by_one_that_does_not(
    scheduler: Scheduler, clock: FakeClock, recorder: Recorder
) -> None:
    reasons: list[CancelReason | None] = []
    started = threading.Event()

    def stubborn() -> None:
        run = current_run()
        started.set()
        run.cancelled.wait(30)
        reasons.append(run.cancel_reason)

    scheduler.add_job(every(seconds=10), stubborn, name="stubborn")
    tick(clock, 10)
    assert started.wait(10)  # on its thread: a run cut off before that is not called
    waiting = threading.Thread(target=scheduler.shutdown, kwargs={"timeout": 60})
    waiting.start()
    poll_until("the shutdown to begin", lambda: not scheduler.running, 5)
    scheduler.shutdown(wait=False)
    waiting.join(10)
    assert not waiting.is_alive(), "the waiting shutdown went on waiting for the run"
    assert reasons == [CancelReason.SHUTDOWN]
    assert recorder.outcomes() == [(START + timedelta(seconds=10), Outcome.ABANDONED)]


def test_an_async_stop_that_waits_is_cut_short_by_one_that_does_not() -> None:
    clock, recorder = FakeClock(START), Recorder()
    reasons: list[CancelReason | None] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            reasons.append(current_run().cancel_reason)

    async def main() -> None:
        s = AsyncScheduler(clock=clock, listeners=[recorder])
        s.add_job(every(seconds=10), stubborn, name="stubborn")
        await s.start()
        while clock.sleepers < 1:
            await asyncio.sleep(0)
        clock.set(START + timedelta(seconds=10))
        await recorder.await_count("before_run", 1)
        waiting = asyncio.ensure_future(s.shutdown(timeout=60))
        while s.running:
            await asyncio.sleep(0)
        await asyncio.wait_for(s.shutdown(wait=False), 10)
        await asyncio.wait_for(waiting, 10)

    asyncio.run(main())
    assert reasons == [CancelReason.SHUTDOWN]
    assert recorder.outcomes() == [(START + timedelta(seconds=10), Outcome.ABANDONED)]


def test_a_run_knows_why_it_was_told_to_stop(clock: FakeClock, recorder: Recorder) -> None:
    backend = LosingBackend()
    seen: dict[str, tuple[CancelReason | None, str | None]] = {}
    started, told = threading.Event(), threading.Event()

    def waits() -> None:
        run = current_run()
        started.set()
        run.cancelled.wait(30)
        seen[run.job_name] = (run.cancel_reason, run.cancel_detail)
        told.set()

    s = Scheduler(clock=clock, backend=backend, listeners=[recorder], stop_timeout=0)
    s.add_job(every(seconds=10), waits, name="timed", timeout=5)
    s.start()
    try:
        tick(clock, 10)
        assert started.wait(10)  # on its thread: a run cut off before that is not called
        clock.set(START + timedelta(seconds=15))
        recorder.wait_count("on_timeout", 1)
        assert told.wait(10)  # its thread read why, before another run's lock is lost
        s.remove_job("timed")
        s.add_job(every(seconds=100), waits, name="lost")
        started.clear()
        clock.set(START + timedelta(seconds=100))
        assert started.wait(10)
        [lost] = recorder.wait_count("before_run", 2)[1:]
        backend.lose(lost.run_id)
        recorder.wait_count("on_abandoned", 1)
    finally:
        s.shutdown()
    assert seen == {
        "timed": (CancelReason.TIMEOUT, "passed its timeout of 0:00:05"),
        "lost": (CancelReason.LOCK_LOST, "lost its lock with the backend session"),
    }


def test_a_more_urgent_reason_replaces_a_milder_one_and_never_the_reverse() -> None:
    run = RunContext("job", START, 1, "r1", None)
    assert (run.cancel_reason, run.cancel_detail, run.cancelled.is_set()) == (None, None, False)
    run.cancel(CancelReason.TIMEOUT, "passed its timeout")
    assert run.cancelled.is_set()
    run.cancel(CancelReason.LOCK_LOST, "lost its lock")
    run.cancel(CancelReason.SHUTDOWN, "shut down")
    run.cancel(CancelReason.TIMEOUT, "passed its timeout again")
    assert (run.cancel_reason, run.cancel_detail) == (CancelReason.LOCK_LOST, "lost its lock")
    plain = RunContext("job", START, 2, "r1", None)
    plain.cancel()  # asked to stop without a reason: it stops, and says none
    assert (plain.cancelled.is_set(), plain.cancel_reason) == (True, None)


def test_every_problem_of_a_job_is_raised_at_once_one_line_each() -> None:
    def task(region: str) -> None:
        pass

    scheduler = Scheduler()
    with pytest.raises(InvalidJobOptionError) as raised:
        scheduler.add_job(
            every(minutes=5),
            task,
            name="report",
            overlap="sometimes",  # type: ignore[arg-type]
            catch_up="never",  # type: ignore[arg-type]
            timeout=-1,
            max_runs=0,
        )
    arguments, *options = str(raised.value).splitlines()
    assert arguments.startswith("job 'report': arguments do not fit task("), arguments
    assert arguments.endswith("missing a required argument: 'region'"), arguments
    assert options == [
        "job 'report': overlap must be one of skip, queue, allow, not 'sometimes'",
        "job 'report': catch_up must be one of latest, none, all, not 'never'",
        "job 'report': max_runs must be a whole number of at least 1, not 0",
        "job 'report': timeout must be positive, not -1s",
    ]
    assert scheduler.jobs() == []
