"""A shutdown has one deadline, which the runs going on are told (``stop_deadline``, on
``time.monotonic()``): the daemon's command jobs time their SIGTERM and SIGKILL by it. A
second call that does not wait moves it to now."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from replicron import AsyncScheduler, Outcome, RunContext, current_run, every
from replicron.testing import FakeClock
from tests.helpers import START, Recorder, assert_no_tasks_left


def test_the_runs_are_told_the_stops_deadline_and_a_hurried_one() -> None:
    async def main() -> None:
        clock, recorder = FakeClock(START), Recorder()
        started = asyncio.Event()
        told: asyncio.Queue[float] = asyncio.Queue()
        runs: list[RunContext] = []

        async def task() -> None:
            run = current_run()
            assert run.stop_deadline is None  # not stopping yet
            run._on_stop = told.put_nowait
            runs.append(run)
            started.set()
            await asyncio.Event().wait()  # until cut off

        scheduler = AsyncScheduler(clock=clock, listeners=[recorder])
        scheduler.add_job(every(seconds=5), task, name="long")
        await scheduler.start()
        clock.advance(timedelta(seconds=5))
        await started.wait()
        before = time.monotonic()
        stopping = asyncio.ensure_future(scheduler.shutdown(timeout=30))
        deadline = await told.get()
        after = time.monotonic()
        assert before + 30 <= deadline <= after + 30
        assert runs[0].stop_deadline == deadline
        # A second call that does not wait: the deadline is now.
        hurried = asyncio.ensure_future(scheduler.shutdown(wait=False))
        now = await told.get()
        assert before <= now <= time.monotonic()
        assert runs[0].stop_deadline == now
        await asyncio.gather(stopping, hurried)
        assert [e.outcome for e in recorder.of("on_abandoned")] == [Outcome.ABANDONED]
        assert_no_tasks_left()

    asyncio.run(main())


def test_a_shutdown_that_does_not_wait_says_now() -> None:
    async def main() -> None:
        clock = FakeClock(START)
        started = asyncio.Event()
        runs: list[RunContext] = []

        async def task() -> None:
            runs.append(current_run())
            started.set()
            await asyncio.Event().wait()

        scheduler = AsyncScheduler(clock=clock)
        scheduler.add_job(every(seconds=5), task, name="long")
        await scheduler.start()
        clock.advance(timedelta(seconds=5))
        await started.wait()
        before = time.monotonic()
        await scheduler.shutdown(wait=False, timeout=30)
        deadline = runs[0].stop_deadline
        assert deadline is not None
        assert before <= deadline <= time.monotonic()

    asyncio.run(main())
