"""What runs leave for Python's garbage collector.

A full collection pass costs time in proportion to every object the collector tracks, and
it pauses every thread. Outcomes a scheduler keeps (each job's last one, the memory
backend's history) must therefore not add tracked objects as the runs go by.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest

from replicron import MemoryBackend, Outcome, RunContext, Scheduler, every
from replicron._runs import Run
from replicron.backends import Claim, ClaimRequest
from replicron.backends.memory import HISTORY_KEPT
from replicron.planner import Tick
from replicron.testing import FakeClock
from tests.helpers import z

START = z(2026, 1, 1)
JOBS = 200


def noop() -> None:
    pass


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
def scheduler(clock: FakeClock, backend: MemoryBackend) -> Iterator[Scheduler]:
    s = Scheduler(clock=clock, backend=backend)
    for i in range(JOBS):
        s.add_job(every(seconds=10), noop, name=f"job-{i:03d}")
    s.start()
    yield s
    s.shutdown()


def tracked_objects() -> int:
    # The least of a few counts: the engine's thread may be planning the next instant
    # meanwhile, and the tuples it makes are tracked until the next collection.
    counts = []
    for _ in range(3):
        gc.collect()
        counts.append(len(gc.get_objects()))
    return min(counts)


def run_ticks(scheduler: Scheduler, clock: FakeClock, first: int, count: int) -> None:
    for k in range(first, first + count):
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=10 * k))
        scheduler.wait_idle()


def test_kept_outcomes_add_no_tracked_objects(
    scheduler: Scheduler, clock: FakeClock, backend: MemoryBackend
) -> None:
    run_ticks(scheduler, clock, 1, 1)
    before = tracked_objects()
    run_ticks(scheduler, clock, 2, HISTORY_KEPT)
    after = tracked_objects()
    # Kept as tracked objects, the history alone would add JOBS * (HISTORY_KEPT - 1).
    assert after - before < JOBS // 4
    # ...and everything kept reads back as it was recorded.
    history = backend.state.history("job-007")
    assert len(history) == HISTORY_KEPT
    assert [r.scheduled_at for r in history] == [
        START + timedelta(seconds=10 * k) for k in range(2, 2 + HISTORY_KEPT)
    ]
    assert {r.outcome for r in history} == {Outcome.SUCCEEDED}
    last = scheduler.get_job("job-007").last_run
    assert last is not None
    assert last.outcome is Outcome.SUCCEEDED
    assert last.scheduled_at == START + timedelta(seconds=10 * (1 + HISTORY_KEPT))


def test_a_sleeping_scheduler_keeps_nothing_of_the_instants_it_ran(
    scheduler: Scheduler, clock: FakeClock
) -> None:
    run_ticks(scheduler, clock, 1, 2)
    gc.collect()
    left = Counter(
        type(o).__name__
        for o in gc.get_objects()
        if isinstance(o, ClaimRequest | Claim | RunContext | Run)
        or (isinstance(o, Tick) and o.scheduled_at <= clock.now())  # not the next instant's
    )
    # Kept until the next instant, a burst's objects would reach the collector's oldest
    # generation each time and make its full passes longer.
    assert left == {}
