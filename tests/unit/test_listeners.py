"""Listeners added and removed at run time; job, scheduler and taken-elsewhere events."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from replicron import (
    InvalidJobOptionError,
    Listener,
    MemoryBackend,
    MemoryState,
    RunEvent,
    Scheduler,
    every,
)
from replicron.testing import FakeClock
from tests.helpers import z

START = z(2026, 1, 1)
T1 = START + timedelta(seconds=10)


def noop() -> None:
    pass


class Everything(Listener):
    """Notes every hook called, with its job (run and job hooks) or replica id."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _note(self, hook: str, what: Any) -> None:
        with self._lock:
            self.seen.append((hook, what.job if isinstance(what, RunEvent) else what))

    def __getattribute__(self, name: str) -> Any:
        if name.startswith(("on_", "before_", "after_")):
            return lambda what: self._note(name, what)
        return super().__getattribute__(name)


def test_listeners_come_and_go_at_run_time_and_hear_of_jobs_and_the_scheduler() -> None:
    clock = FakeClock(START)
    first, later = Everything(), Everything()
    s = Scheduler(clock=clock, listeners=[first], replica_id="r1")
    s.add_job(every(seconds=10), noop, name="early")  # before start: no job event
    s.start()
    try:
        s.add_listener(later)
        job = s.add_job(every(seconds=10), noop, name="late")
        job.update(timeout=5)
        clock.set(T1)
        s.wait_idle()
        s.remove_listener(later)
        s.remove_listener(later)  # not there any more: nothing happens
        job.remove()
        s.wait_idle()
    finally:
        s.shutdown()
    runs = [("before_run", "early"), ("before_run", "late")]
    done = [("after_success", "early"), ("after_success", "late")]
    assert first.seen[:3] == [
        ("on_started", "r1"),
        ("on_job_added", "late"),
        ("on_job_updated", "late"),
    ]
    assert sorted(first.seen[3:7]) == sorted(runs + done)
    assert first.seen[7:] == [("on_job_removed", "late"), ("on_stopped", "r1")]
    assert later.seen[:2] == [("on_job_added", "late"), ("on_job_updated", "late")]
    assert sorted(later.seen[2:]) == sorted(runs + done)  # and nothing after its removal


def test_a_tick_another_replica_claimed_first_is_told() -> None:
    clock, state = FakeClock(START), MemoryState()
    heard = [Everything(), Everything()]
    schedulers = [
        Scheduler(clock=clock, backend=MemoryBackend(state), replica_id=f"r{i}", listeners=[h])
        for i, h in enumerate(heard)
    ]
    for s in schedulers:
        s.add_job(every(seconds=10), noop, name="job")
        s.start()
    try:
        clock.set(T1)
        for s in schedulers:
            s.wait_idle()
    finally:
        for s in schedulers:
            s.shutdown()
    outcomes = sorted(
        hook for h in heard for hook, _ in h.seen if hook in ("after_success", "on_taken")
    )
    assert outcomes == ["after_success", "on_taken"]


def test_only_listeners_can_be_added() -> None:
    s = Scheduler()
    with pytest.raises(InvalidJobOptionError, match=r"replicron\.Listener instances"):
        s.add_listener(object())  # type: ignore[arg-type]


def test_outcomes_say_whether_the_task_ran_and_whether_it_went_wrong() -> None:
    from replicron import Outcome

    assert {o for o in Outcome if o.ran} == {
        Outcome.SUCCEEDED,
        Outcome.FAILED,
        Outcome.TIMED_OUT,
        Outcome.ABANDONED,
    }
    assert {o for o in Outcome if o.is_failure} == {
        Outcome.FAILED,
        Outcome.TIMED_OUT,
        Outcome.ABANDONED,
    }
    assert Outcome("paused").ran is False
