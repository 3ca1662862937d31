"""A run under way: what its task sees as ``current_run()`` and the engine's bookkeeping of
it, in one object (one allocation per run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from replicron.context import CancelReason, RunContext
from replicron.events import Outcome, RunEvent

from .registry import JobState

__all__ = ["Run", "past_grace"]


def past_grace(late: timedelta, grace: timedelta) -> str:
    """Why a tick that would have started ``late`` is recorded missed."""
    return f"it would have started {late} after its tick, past misfire_grace {grace}"


class Run(RunContext):
    """A run under way: the context its task sees (``current_run()``) and, in the same
    object (one allocation per run), the engine's bookkeeping of it."""

    __slots__ = (
        "call",
        "error",
        "finished",
        "finished_at",
        "locked",
        "missed",
        "returned_late",
        "start_by",
        "started_at",
        "state",
        "task",
        "timed_out",
        "unix_finished",
        "unix_started",
        "unstarted",
    )

    def __init__(self, state: JobState, job: str, scheduled_at: datetime, replica_id: str) -> None:
        # RunContext's fields set here rather than through its __init__: once per run. The
        # run id, lock, start and deadline are set when the run starts (see ``start``).
        self.job_name = job
        self.scheduled_at = scheduled_at
        self.manual = False
        self.run_id: int | None = None
        self.replica_id = replica_id
        self.deadline: datetime | None = None
        self.cancel_reason: CancelReason | None = None
        self.cancel_detail: str | None = None  # what cut the run off, for the ledger too
        self._event = None
        self._stop = False
        self._lease_end: Callable[[], float | None] | None = None  # set if started locked
        self._stop_by: float | None = None
        self._on_stop: Callable[[float], None] | None = None
        #: Whether the task returned past its lease's end, as seen when it returned (``None``
        #: until then, or without a lease).
        self.returned_late: bool | None = None
        self.state = state
        self.locked = False
        self.started_at = scheduled_at
        self.timed_out = self.finished = False  # timed_out: on_timeout was told at the deadline
        self.task: asyncio.Task[None] | None = None
        # The task as it was when the run started: a job updated meanwhile runs the new one
        # from its next run on.
        self.call: Callable[[], Any] = state.spec.call
        # A sync run's result, handed back to the loop with the run.
        self.error: BaseException | None = None
        self.finished_at: datetime | None = None
        # Where the clock tells Unix time: the sync run's real start and end, on its thread.
        self.unix_started: float | None = None
        self.unix_finished = 0.0
        #: The latest start its job's ``misfire_grace`` allows (a sync run, which may wait
        #: for a worker thread), and, if it came too late, why it was not run.
        self.start_by: datetime | None = None
        self.missed: str | None = None
        #: Cut off (timed out, its lock lost) before a worker thread was free, or before its
        #: async task's first step: never called.
        self.unstarted = False

    def event(self, outcome: Outcome | None, error: BaseException | None) -> RunEvent:
        return RunEvent(
            self.job_name,
            self.scheduled_at,
            self.replica_id,
            self.run_id,
            outcome,
            self.started_at,
            None,
            error,
            None,
            self.manual,
        )

    @property
    def abandoned(self) -> bool:
        reason = self.cancel_reason
        return reason is not None and reason is not CancelReason.TIMEOUT

    def cut_off(self, reason: CancelReason, detail: str) -> None:
        """Tell the run to stop: its task is cancelled, a sync task sees ``cancelled`` set."""
        if reason is CancelReason.TIMEOUT:
            self.timed_out = True
        self.cancel(reason, detail)
        if self.task is not None:
            self.task.cancel()

    def returned(self) -> None:
        """The task has just returned (or raised). Whether it did so within its lease is
        decided now, not when the loop gets to its result: a result that waits for the loop
        while heartbeats fail must not read as late for a run that ended in time."""
        if self._lease_end is not None:
            self.returned_late = self._past_lease_end()

    def outcome(
        self, error: BaseException | None, finished: datetime
    ) -> tuple[Outcome, str | None]:
        """How the run ended (``error``: what its task raised, if anything), and the words the
        ledger keeps of it."""
        if self.missed is not None:
            return Outcome.MISSED, self.missed
        late = self.returned_late
        if late is None:  # cut off before it returned (at shutdown, say)
            late = self._past_lease_end()
        if not self.abandoned and late:
            self.cancel(CancelReason.LOCK_LOST, "its lease ended before it returned")
        if self.abandoned:
            outcome = Outcome.ABANDONED
        elif self.timed_out:
            outcome = Outcome.TIMED_OUT
            deadline = self.deadline
            overrun = timedelta(0) if deadline is None else finished - deadline
            if self.unstarted:
                before = (
                    "no worker thread was free before"
                    if self.task is None
                    else "before its task started"
                )
                self.cancel_detail = f"{self.cancel_detail}; {before}"
            elif self.task is None and overrun > timedelta(0):
                returned = f"the sync task returned {overrun} after it"
                self.cancel_detail = f"{self.cancel_detail}; {returned}"
        else:
            outcome = Outcome.FAILED if error is not None else Outcome.SUCCEEDED
        return outcome, self.cancel_detail if error is None else f"{type(error).__name__}: {error}"
