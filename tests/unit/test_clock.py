"""SystemClock and the public FakeClock."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import pytest

from replicron import Clock, NaiveDatetimeError, SystemClock
from replicron.testing import FakeClock

START = datetime(2026, 3, 1, tzinfo=UTC)


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SystemClock(), Clock)
    assert isinstance(FakeClock(), Clock)


def test_system_clock_is_aware_utc_and_past_deadlines_return_at_once() -> None:
    clock = SystemClock()
    now = clock.now()
    assert now.tzinfo is UTC
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)
    clock.sleep_until(now - timedelta(days=1))
    asyncio.run(clock.asleep_until(now - timedelta(days=1)))


def test_fake_clock_stands_still_and_moves_when_told() -> None:
    clock = FakeClock(START)
    assert clock.now() == START
    assert clock.now() == START
    assert clock.advance(timedelta(minutes=5)) == START + timedelta(minutes=5)
    assert clock.set(START) == START
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(timedelta(seconds=-1))
    with pytest.raises(NaiveDatetimeError):
        clock.set(datetime(2026, 1, 1))
    with pytest.raises(NaiveDatetimeError):
        FakeClock(datetime(2026, 1, 1))


def test_fake_clock_normalises_to_utc() -> None:
    from zoneinfo import ZoneInfo

    clock = FakeClock(datetime(2026, 3, 1, 2, tzinfo=ZoneInfo("Europe/Kyiv")))
    assert clock.now() == datetime(2026, 3, 1, 0, tzinfo=UTC)
    assert clock.now().tzinfo is UTC


def test_thread_sleeper_wakes_only_when_its_deadline_is_reached() -> None:
    clock = FakeClock(START)
    woke = threading.Event()

    def sleeper() -> None:
        clock.sleep_until(START + timedelta(seconds=10))
        woke.set()

    thread = threading.Thread(target=sleeper)
    thread.start()
    assert clock.wait_for_sleepers(1)
    assert clock.next_deadline() == START + timedelta(seconds=10)
    clock.advance(timedelta(seconds=9))
    # Still asleep: the sleeper is registered again after re-checking its deadline.
    assert clock.wait_for_sleepers(1)
    assert not woke.is_set()
    clock.advance(timedelta(seconds=1))
    thread.join(timeout=10)
    assert woke.is_set()
    assert clock.sleepers == 0
    assert clock.next_deadline() is None


def test_async_sleepers_wake_in_deadline_order() -> None:
    clock = FakeClock(START)

    async def main() -> list[int]:
        order: list[int] = []

        async def sleeper(seconds: int) -> None:
            await clock.asleep_until(START + timedelta(seconds=seconds))
            order.append(seconds)

        tasks = [asyncio.create_task(sleeper(s)) for s in (30, 10, 20)]
        while clock.sleepers < 3:
            await asyncio.sleep(0)
        assert clock.next_deadline() == START + timedelta(seconds=10)
        clock.advance(timedelta(seconds=15))
        while not order:
            await asyncio.sleep(0)
        assert order == [10]
        clock.set(START + timedelta(seconds=30))
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == [10, 20, 30]
    assert clock.sleepers == 0


def test_async_sleep_with_past_deadline_and_cancellation() -> None:
    clock = FakeClock(START)

    async def main() -> None:
        await clock.asleep_until(START)  # already due: returns without waiting
        task = asyncio.create_task(clock.asleep_until(START + timedelta(hours=1)))
        while clock.sleepers < 1:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert clock.sleepers == 0

    asyncio.run(main())


def test_async_sleeper_on_another_threads_loop_is_woken_thread_safely() -> None:
    clock = FakeClock(START)
    done = threading.Event()

    def run_loop() -> None:
        asyncio.run(clock.asleep_until(START + timedelta(minutes=1)))
        done.set()

    thread = threading.Thread(target=run_loop)
    thread.start()
    assert clock.wait_for_sleepers(1)
    clock.advance(timedelta(minutes=1))
    thread.join(timeout=10)
    assert done.is_set()


def test_wait_for_sleepers_times_out_without_sleepers() -> None:
    assert FakeClock(START).wait_for_sleepers(1, timeout=0.01) is False


def test_real_time_clocks_read_unix_times_and_others_do_not() -> None:
    import time

    from replicron.clock import ClusterClock

    system = SystemClock()
    unix = time.time()
    assert system.tells_unix_time()
    assert system.from_unix(unix) == datetime.fromtimestamp(unix, UTC)
    ahead = ClusterClock(system, lambda: timedelta(seconds=3))
    assert ahead.tells_unix_time()
    assert ahead.from_unix(unix) == datetime.fromtimestamp(unix, UTC) + timedelta(seconds=3)
    unmeasured = ClusterClock(system, lambda: None)
    assert unmeasured.from_unix(unix) == datetime.fromtimestamp(unix, UTC)
    assert not ClusterClock(FakeClock(START), lambda: None).tells_unix_time()


def test_system_clock_never_wakes_before_its_deadline() -> None:
    # It aims early with the loop's timer and sleeps the last stretch on the thread.
    clock = SystemClock()

    async def sleep_many() -> list[datetime]:
        deadlines = []
        for step in range(1, 20):
            deadline = clock.now() + timedelta(microseconds=700 * step)
            await clock.asleep_until(deadline)
            assert clock.now() >= deadline
            deadlines.append(deadline)
        return deadlines

    assert len(asyncio.run(sleep_many())) == 19
