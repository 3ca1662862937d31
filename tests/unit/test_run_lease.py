"""A run under a lease (a backend whose locks can run out, such as PostgreSQL's) sees its
lease's end, and reads as cancelled once that end has passed, before the scheduler notices:
a process frozen past it and woken must not go on as if it still held the job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

import pytest

from replicron import CancelReason, Outcome, RunContext, RunEvent, Scheduler, current_run, every
from replicron.backends.memory import MemoryBackend
from replicron.testing import FakeClock
from tests.helpers import START, step


class LeasingBackend(MemoryBackend):
    """The in-process backend, with a lease on each locked run that the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: dict[int, float] = {}
        self.default_end = time.monotonic() + 3600

    def lease_end(self, run_id: int) -> float | None:
        return self.ends.get(run_id, self.default_end)


def run_past_its_lease(
    overlap: Literal["skip", "allow"],
    look: Callable[[RunContext], None],
    *,
    expire: bool = True,
    renew: bool = True,
) -> tuple[LeasingBackend, RunEvent | None]:
    """One run of a job, during which (with ``expire``) its lease, if it has one, runs out and
    (with ``renew``) is then renewed by a late heartbeat, as a backend that does not refuse
    one might; ``look`` sees the run before, in between and after, and the task returns
    normally. The backend and the job's last run."""
    backend, clock = LeasingBackend(), FakeClock(START)

    def task() -> None:
        run = current_run()
        assert run.run_id is not None
        look(run)  # before: the lease as it was
        if expire:
            backend.ends[run.run_id] = time.monotonic() - 0.001  # the lease ran out meanwhile
        look(run)
        if renew:
            backend.ends[run.run_id] = time.monotonic() + 3600  # a heartbeat got through
        look(run)

    with Scheduler(clock=clock, backend=backend, replica_id="r1") as scheduler:
        scheduler.add_job(every(seconds=10), task, name="report", overlap=overlap)
        step(clock, START + timedelta(seconds=10))
        scheduler.wait_idle()
        [job] = scheduler.jobs()
        return backend, job.last_run


@pytest.mark.parametrize("overlap", ["skip", "allow"])
def test_a_locked_run_sees_its_lease_and_reads_cancelled_past_its_end(
    overlap: Literal["skip", "allow"],
) -> None:
    seen: list[tuple[float | None, bool, bool]] = []

    def look(run: RunContext) -> None:
        seen.append((run.lease_deadline, run.cancelled.is_set(), run.cancelled.wait(0)))

    backend, run = run_past_its_lease(overlap, look)
    [(before, was_set, _), (_, is_set, waited), (_, still_set, still_waited)] = seen
    assert run is not None
    if overlap == "skip":  # locked: under the lease
        assert (before, was_set) == (backend.default_end, False)
        assert (is_set, waited) == (True, True)
        # Once read as set, it stays set: the task may already have stopped on it.
        assert (still_set, still_waited) == (True, True)
        assert run.outcome is Outcome.ABANDONED
    else:  # no lock, no lease: nothing to run out
        assert before is None
        assert (was_set, is_set, waited, still_set) == (False, False, False, False)
        assert run.outcome is Outcome.SUCCEEDED


def test_a_locked_run_that_ends_within_its_lease_succeeds() -> None:
    seen: list[bool] = []
    backend, run = run_past_its_lease(
        "skip", lambda run: seen.append(run.cancelled.is_set()), expire=False
    )
    assert seen == [False, False, False]
    assert run is not None
    assert run.outcome is Outcome.SUCCEEDED
    assert [r.outcome for r in backend.state.history("report")] == [Outcome.SUCCEEDED]


def test_a_run_that_returns_after_its_lease_ended_is_recorded_abandoned() -> None:
    """Its lease may have been taken over meanwhile, so its return must not be written as a
    success, even by a task that never looks at ``cancelled``: the ledger says abandoned,
    and the run's reason says the lock was lost."""
    reasons: list[CancelReason | None] = []
    backend, run = run_past_its_lease(
        "skip", lambda run: reasons.append(run.cancel_reason), renew=False
    )
    assert reasons == [None, None, None]  # the run's end decides the reason
    [record] = backend.state.history("report")
    assert record.outcome is Outcome.ABANDONED
    assert run is not None
    assert run.outcome is Outcome.ABANDONED
    assert "lease ended" in (record.error or "")


class ResultHandledLate(LeasingBackend):
    """A lease still on for the thread that runs the task, and ended for any other: the
    scheduler's loop gets to the run's result only after the lease ran out (its heartbeats
    failing meanwhile, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.task_thread: threading.Thread | None = None

    def lease_end(self, run_id: int) -> float | None:
        if threading.current_thread() is self.task_thread:
            return time.monotonic() + 3600
        return time.monotonic() - 0.001


def test_a_run_that_returned_within_its_lease_succeeds_however_late_its_result_is_handled() -> None:
    """What counts is when the task returned: a run that ended in time did not overlap a
    takeover, whenever the loop got to write its outcome."""
    backend, clock = ResultHandledLate(), FakeClock(START)

    def task() -> None:
        backend.task_thread = threading.current_thread()

    with Scheduler(clock=clock, backend=backend, replica_id="r1") as scheduler:
        scheduler.add_job(every(seconds=10), task, name="report", overlap="skip")
        step(clock, START + timedelta(seconds=10))
        scheduler.wait_idle()
    assert backend.task_thread is not None  # it ran, on a thread of its own
    assert [r.outcome for r in backend.state.history("report")] == [Outcome.SUCCEEDED]
