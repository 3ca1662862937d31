"""Runs and Python's garbage collector.

A full collection pass costs time in proportion to every object the collector tracks, and
it pauses every thread. Outcomes a scheduler keeps (each job's last one, the memory
backend's history) must therefore not add tracked objects as the runs go by, nothing of an
instant may stay alive once it is over, and the automatic collector waits while an instant's
runs start.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta

import pytest

from replicron import MemoryBackend, Outcome, RunContext, Scheduler, every
from replicron._engine import collector as _collector
from replicron._engine import sync_runs as _sync_runs
from replicron._engine.collector import HOLD_LIMIT, CollectorHold, holding
from replicron._engine.planner import Tick
from replicron.backends import Claim, ClaimRequest
from replicron.backends.memory import HISTORY_KEPT
from replicron.testing import FakeClock
from tests.helpers import START, noop, poll_until

JOBS = 200


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


def run_ticks(scheduler: Scheduler, clock: FakeClock, first: int, count: int) -> None:
    for k in range(first, first + count):
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=10 * k))
        scheduler.wait_idle()


def test_kept_outcomes_add_no_tracked_objects(
    scheduler: Scheduler, clock: FakeClock, backend: MemoryBackend
) -> None:
    run_ticks(scheduler, clock, 1, HISTORY_KEPT + 1)
    gc.collect()  # (a tuple of untracked items is untracked by the collector's first look)
    # Each job's history and latest outcome: none of it tracked, whatever they hold.
    kept: list[object] = []
    for i in range(JOBS):
        name = f"job-{i:03d}"
        kept += backend.state.job(name).history
        state = scheduler._engine.registry.get(name)
        assert state is not None
        kept.append(state.last_record)
    assert len(kept) == JOBS * (HISTORY_KEPT + 1)
    assert [o for o in kept if gc.is_tracked(o)] == []
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


def test_a_sleeping_scheduler_keeps_nothing_of_the_instants_it_ran(clock: FakeClock) -> None:
    # Jobs of its own: only their objects are counted, not what earlier tests left behind.
    scheduler = Scheduler(clock=clock, backend=MemoryBackend())
    names = {f"sleeper-{i:03d}" for i in range(JOBS)}
    for name in names:
        scheduler.add_job(every(seconds=10), noop, name=name)
    scheduler.start()
    try:
        run_ticks(scheduler, clock, 1, 2)
        assert_nothing_left_of_the_instants_run(clock, names)
    finally:
        scheduler.shutdown()


def assert_nothing_left_of_the_instants_run(clock: FakeClock, names: set[str]) -> None:
    def job_of(o: Tick | ClaimRequest | Claim | RunContext) -> str:
        return o.job_name if isinstance(o, RunContext) else o.job

    def left() -> Counter[str]:
        gc.collect()
        return Counter(
            type(o).__name__
            for o in gc.get_objects()
            if isinstance(o, Tick | ClaimRequest | Claim | RunContext)
            and job_of(o) in names
            and o.scheduled_at <= clock.now()  # not the next instant's, made ahead
        )

    # Kept until the next instant, a burst's objects would reach the collector's oldest
    # generation each time and make its full passes longer. (A worker thread lets go of its
    # last run just after handing it back: on a busy machine it may not have yet when the
    # scheduler is idle, so the check waits for the threads to get there.)
    with contextlib.suppress(AssertionError):
        poll_until("the worker threads to let go of their last run", lambda: not left(), 10)
    assert left() == {}


# ---- the collector is held back while an instant's runs start ---------------------------


@pytest.fixture
def holds() -> Iterator[list[CollectorHold]]:
    """Holds made by a test, all released afterwards even if it fails half-way."""
    made: list[CollectorHold] = []
    yield made
    for hold in made:
        hold.release()


def test_holds_nest_across_schedulers_and_restore_the_collector(
    holds: list[CollectorHold],
) -> None:
    before = gc.get_threshold()
    holds += [CollectorHold(True), CollectorHold(True), CollectorHold(False)]
    first, second, off = holds
    assert off.take() is False
    assert not holding()
    assert first.take() is True
    assert first.take() is False  # one hold per scheduler
    assert second.take() is True
    assert holding()
    first.release()
    first.release()  # a second release changes nothing
    assert holding()  # the other scheduler still holds it
    second.release()
    assert not holding()
    assert gc.get_threshold() == before


def test_the_applications_own_gc_disable_is_never_overridden(
    holds: list[CollectorHold],
) -> None:
    holds.append(hold := CollectorHold(True))
    try:
        gc.disable()  # before a hold
        hold.take()
        hold.release()
        assert not gc.isenabled()
        gc.enable()
        hold.take()
        gc.disable()  # during a hold
        hold.release()
        assert not gc.isenabled()
        gc.enable()
        hold.take()
        assert gc.isenabled()  # a hold leaves the switch alone
    finally:
        gc.enable()


def test_thresholds_the_application_sets_during_a_hold_stand(
    holds: list[CollectorHold],
) -> None:
    before = gc.get_threshold()
    holds.append(hold := CollectorHold(True))
    try:
        hold.take()
        gc.set_threshold(1234, 11, 12)
        hold.release()
        assert gc.get_threshold() == (1234, 11, 12)
    finally:
        gc.set_threshold(*before)


def test_a_child_forked_during_a_hold_has_the_collector_back(
    holds: list[CollectorHold],
) -> None:
    holds.append(hold := CollectorHold(True))
    hold.take()
    pid = os.fork()
    if pid == 0:  # the child: nothing there would ever release the parent's hold
        child_hold = CollectorHold(True)
        child_hold.take()
        child_hold.release()
        hold.release()  # a hold from before the fork changes nothing
        os._exit(1 if holding() else 0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert holding()  # the parent still holds it
    hold.release()
    assert not holding()


def test_importing_replicron_registers_no_fork_hook() -> None:
    import subprocess
    import sys

    code = (
        "import os, replicron, replicron._engine.collector as c; "
        "s = replicron.Scheduler(); s.start(); s.shutdown(); "
        "print(c._fork_hook)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def run_two_jobs_on_one_thread(
    clock: FakeClock, first: Callable[[], object], *, defer_gc: bool = False
) -> None:
    """Run one instant of two jobs on one worker thread: while the first runs, the second
    waits for the thread (if both are sync)."""
    s = Scheduler(clock=clock, max_workers=1, defer_gc=defer_gc)
    s.add_job(every(seconds=10), first, name="first")
    s.add_job(every(seconds=10), noop, name="second")
    s.start()
    try:
        run_ticks(s, clock, 1, 1)
    finally:
        s.shutdown()


@pytest.mark.parametrize("defer_gc", [True, False])
def test_the_collector_waits_while_an_instants_runs_start(
    clock: FakeClock, defer_gc: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However slowly the first run's thread gets going, the limit does not end the hold.
    monkeypatch.setattr(_sync_runs, "HOLD_LIMIT", 60.0)
    seen: list[bool] = []
    run_two_jobs_on_one_thread(clock, lambda: seen.append(not holding()), defer_gc=defer_gc)
    assert seen == [not defer_gc]


def test_async_runs_begin_with_the_collector_let_go(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An async run's first step runs on the engine's loop: holding the collector through
    # it, a step that blocks the loop would hold it past the limit, which needs the loop.
    monkeypatch.setattr(_sync_runs, "HOLD_LIMIT", 60.0)
    seen: list[bool] = []

    async def first() -> None:
        seen.append(not holding())

    run_two_jobs_on_one_thread(clock, first, defer_gc=True)
    assert seen == [True]


class _ClaimWatcher(MemoryBackend):
    """The in-memory backend, noting whether the collector is held while it claims."""

    held_while_claiming: list[bool]

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        self.held_while_claiming.append(holding())
        return await super().claim(requests)


def test_the_hold_begins_only_once_the_claims_are_answered(clock: FakeClock) -> None:
    # A slow claim (an unreachable database, a contended file lock) must not hold the
    # collector back: the hold covers starting the runs, not waiting for the backend.
    backend = _ClaimWatcher()
    backend.held_while_claiming = []
    seen: list[bool] = []
    s = Scheduler(clock=clock, backend=backend, defer_gc=True)
    s.add_job(every(seconds=10), lambda: seen.append(holding()), name="job")
    s.start()
    try:
        run_ticks(s, clock, 1, 1)
    finally:
        s.shutdown()
    assert backend.held_while_claiming == [False]
    assert seen == [True]  # the hold itself is on: the run began inside it


def test_the_collector_is_held_back_for_at_most_the_limit(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = threading.Event()
    release = _collector._release

    def spied_release(generation: int) -> None:
        release(generation)
        released.set()

    monkeypatch.setattr(_collector, "_release", spied_release)
    waited: list[bool] = []

    def first() -> None:
        # The second run waits for this thread until this one returns, yet the hold ends,
        # within a generous bound of the limit.
        waited.append(released.wait(max(2.0, 20 * HOLD_LIMIT)))

    run_two_jobs_on_one_thread(clock, first, defer_gc=True)
    assert waited == [True]
