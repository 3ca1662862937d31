"""AsyncScheduler: the same engine on the caller's event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import pytest

from replicron import (
    AsyncScheduler,
    MemoryBackend,
    MemoryState,
    Outcome,
    SchedulerClosedError,
    current_run,
    every,
)
from replicron.testing import FakeClock
from tests.helpers import Recorder, assert_no_tasks_left, z

START = z(2026, 1, 1)


async def until_asleep(clock: FakeClock, count: int = 1) -> None:
    """Yield to the loop until ``count`` tasks sleep on the clock (no wall-clock sleeping)."""
    for _ in range(10_000):
        if clock.sleepers >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError("the scheduler never went to sleep")


def test_async_context_manager_runs_async_and_sync_jobs() -> None:
    async def main() -> None:
        clock, recorder = FakeClock(START), Recorder()
        loop = asyncio.get_running_loop()
        where: dict[str, object] = {}

        async def on_loop(tag: str) -> None:
            where[tag] = asyncio.get_running_loop()
            assert current_run().scheduled_at == START + timedelta(seconds=5)

        def in_thread() -> None:
            where["thread"] = threading.current_thread().name

        async with AsyncScheduler(clock=clock, listeners=[recorder]) as s:
            s.add_job(every(seconds=5), on_loop, "async", name="a")
            s.add_job(every(seconds=5), in_thread, name="s")
            await until_asleep(clock)
            clock.advance(timedelta(seconds=5))
            await recorder.await_count("after_success", 2)
            await s.wait_idle()
            assert where["async"] is loop
            assert str(where["thread"]).startswith("replicron-worker-")
            assert s.running
        assert not s.running
        assert_no_tasks_left()
        assert sorted((e.job, e.outcome) for e in recorder.of("after_success")) == [
            ("a", Outcome.SUCCEEDED),
            ("s", Outcome.SUCCEEDED),
        ]

    asyncio.run(main())


def test_shutdown_is_idempotent_and_concurrent_calls_agree() -> None:
    async def main() -> None:
        s = AsyncScheduler(clock=FakeClock(START))
        await s.start()
        await asyncio.gather(s.shutdown(), s.shutdown())
        await s.shutdown()
        with pytest.raises(SchedulerClosedError):
            s.add_job(every(seconds=1), print, name="p")
        with pytest.raises(SchedulerClosedError):
            await s.start()
        assert_no_tasks_left()

    asyncio.run(main())


def test_shutdown_cancels_async_runs_after_the_timeout() -> None:
    async def main() -> None:
        clock, recorder = FakeClock(START), Recorder()
        cancelled = asyncio.Event()

        async def forever() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

        s = AsyncScheduler(clock=clock, listeners=[recorder])
        await s.start()
        s.add_job(every(seconds=1), forever, name="f")
        await until_asleep(clock)
        clock.advance(timedelta(seconds=1))
        await recorder.await_count("before_run", 1)
        await s.shutdown(timeout=0.01)
        assert_no_tasks_left()
        assert cancelled.is_set()
        assert recorder.outcomes() == [(START + timedelta(seconds=1), Outcome.ABANDONED)]

    asyncio.run(main())


def test_logging_carries_job_tick_and_replica_and_taken_is_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        clock, state = FakeClock(START), MemoryState()
        a = AsyncScheduler(clock=clock, backend=MemoryBackend(state), replica_id="a")
        b = AsyncScheduler(clock=clock, backend=MemoryBackend(state), replica_id="b")
        async with a, b:
            for s in (a, b):
                s.add_job(every(seconds=1), lambda: None, name="j")
            await until_asleep(clock, 2)
            clock.advance(timedelta(seconds=1))
            await a.wait_idle()
            await b.wait_idle()
        assert_no_tasks_left()

    caplog.set_level(logging.DEBUG, logger="replicron")
    asyncio.run(main())
    tick = (START + timedelta(seconds=1)).isoformat()
    by_event: dict[str, list[logging.LogRecord]] = {}
    for record in caplog.records:
        by_event.setdefault(record.event, []).append(record)  # type: ignore[attr-defined]
    [taken] = by_event["taken"]
    [succeeded] = by_event["succeeded"]
    assert taken.levelno == logging.DEBUG
    assert {taken.replica, succeeded.replica} == {"a", "b"}  # type: ignore[attr-defined]
    for record in (taken, succeeded):
        assert record.job == "j"  # type: ignore[attr-defined]
        assert record.tick == tick  # type: ignore[attr-defined]
    assert len(by_event["scheduler_started"]) == 2
    assert len(by_event["scheduler_stopped"]) == 2
