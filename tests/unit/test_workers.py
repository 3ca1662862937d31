"""The worker pool: one thread drains a burst; another wakes only for a stuck one."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

import pytest

from replicron._engine.workers import STUCK_AFTER, WorkerPool, needs_another_thread
from tests.helpers import poll_until

NOW = 1000.0
OLD = NOW - 2 * STUCK_AFTER
FRESH = NOW - STUCK_AFTER / 2


@pytest.mark.parametrize(
    ("starts", "signalled", "progressed", "expected"),
    [
        ([], 0, False, True),  # runs wait and nobody is awake
        ([OLD], 0, False, True),  # the one awake thread is stuck in a run
        ([OLD, OLD], 0, False, True),
        ([OLD, FRESH], 0, False, False),  # one of them is still moving
        ([OLD, None], 0, False, False),  # one is between runs: it takes the next
        ([FRESH], 0, False, False),
        ([OLD], 0, True, False),  # a run was taken since the last look
        ([], 1, False, False),  # a woken thread is on its way (waiting for the GIL)
        ([OLD], 1, False, False),
        ([OLD, OLD, OLD, OLD], 0, False, False),  # every thread is awake already
    ],
)
def test_when_another_thread_is_woken(
    starts: list[float | None], signalled: int, progressed: bool, expected: bool
) -> None:
    assert needs_another_thread(starts, signalled, 4, progressed, NOW) is expected


class Concurrency:
    """A handler that counts how many items are handled at once."""

    def __init__(self, total: int) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.handled = 0
        self.total = total
        self.done = threading.Event()

    def __call__(self, item: int) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0)  # lets any other awake thread in
        with self.lock:
            self.now -= 1
            self.handled += 1
            if self.handled == self.total:
                self.done.set()


@pytest.fixture
def long_switch_interval() -> Iterator[None]:
    # The submitting thread keeps the GIL for the whole burst of submissions, as the event
    # loop does while it starts an instant's runs: no woken thread begins in between.
    before = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("long_switch_interval")
def test_submissions_before_any_thread_begins_wake_one_thread() -> None:
    handler = Concurrency(total=400)
    pool: WorkerPool[int] = WorkerPool(4, "replicron-test-worker", handler)
    try:
        for chunk in range(4):
            pool.submit_many(range(chunk * 100, (chunk + 1) * 100))
        assert handler.done.wait(10)
    finally:
        stuck = pool.stop(5)
    assert stuck == []
    assert handler.handled == 400
    assert handler.most == 1


def test_the_pool_measures_how_long_a_run_holds_its_thread() -> None:
    finished = threading.Event()
    held = 0.02

    def handler(item: int) -> None:
        time.sleep(held)  # the run's length: what is measured, not a wait for another thread
        if item == 4:
            finished.set()

    pool: WorkerPool[int] = WorkerPool(1, "replicron-test-worker", handler)
    try:
        assert pool.run_seconds is None
        pool.submit_many(range(5))
        assert finished.wait(10)
    finally:
        assert pool.stop(5) == []
    measured = pool.run_seconds
    assert measured is not None
    assert held <= measured < 1.0  # seconds, the mean of runs that each slept `held`


@pytest.mark.usefixtures("long_switch_interval")
def test_once_runs_are_known_to_be_long_a_burst_wakes_the_threads_it_needs_at_once() -> None:
    # No supervisor wakes threads here: only the submission does. Four runs that wait for
    # each other all get through only if four threads were woken for them.
    barrier = threading.Barrier(4, timeout=10)
    first_done, all_met = threading.Event(), threading.Event()
    met: list[int] = []

    def handler(item: int) -> None:
        if item < 0:
            time.sleep(2 * STUCK_AFTER)  # a run long enough to be worth a thread of its own
            first_done.set()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        met.append(item)
        if len(met) == 4:
            all_met.set()

    pool: WorkerPool[int] = WorkerPool(4, "replicron-test-worker", handler)
    try:
        pool.submit_many([-1])
        assert first_done.wait(10)
        poll_until("the first run measured", lambda: pool.run_seconds is not None, 10)
        pool.submit_many(range(4))
        assert all_met.wait(20)
    finally:
        stuck = pool.stop(5)
    assert stuck == []
    assert sorted(met) == [0, 1, 2, 3]
