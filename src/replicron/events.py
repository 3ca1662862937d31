"""Outcomes, run events and listeners."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

__all__ = ["Listener", "Outcome", "RunEvent"]


class Outcome(enum.StrEnum):
    """How a tick ended. Every tick a replica claims ends in exactly one of these."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    #: The job's previous run was still going (overlap policy ``skip``).
    SKIPPED_OVERLAP = "skipped_overlap"
    #: The scheduler's ``max_concurrent_jobs`` was reached with ``concurrency_mode="skip"``.
    SKIPPED_LIMIT = "skipped_limit"
    #: Not run: a later tick of the job was already due, nobody was up, or shutdown came first.
    MISSED = "missed"
    #: The run was cut off: its replica lost its lock or stopped before the run returned.
    ABANDONED = "abandoned"
    #: Not run: the job was paused across the cluster (``Job.pause``, ``replicron pause``).
    PAUSED = "paused"

    @property
    def ran(self) -> bool:
        """The task was started (succeeded, failed, timed out or abandoned): a run that
        ``max_runs`` counts."""
        return self in _RAN

    @property
    def is_failure(self) -> bool:
        """The run went wrong (failed, timed out or abandoned): something to act on."""
        return self in _FAILURES


_FAILURES = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.ABANDONED})
_RAN = _FAILURES | {Outcome.SUCCEEDED}


@dataclass(frozen=True, slots=True)
class RunEvent:
    """What a listener is told about a tick or run.

    ``outcome`` is ``None`` in ``before_run``. ``lateness`` is how long after the tick the run
    started; ``duration`` how long it ran (both ``None`` when it did not run).
    """

    job: str
    scheduled_at: datetime
    replica_id: str
    run_id: int | None = None
    outcome: Outcome | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: BaseException | None = None
    detail: str | None = None
    #: A manual run (``Job.run_now``): ``scheduled_at`` is when it was asked for.
    manual: bool = False
    #: How many ticks the event stands for: 1, or for a range of missed ticks past the
    #: enumeration bound (one event, from ``scheduled_at`` through ``last_scheduled_at``) how
    #: many it holds.
    ticks: int = 1
    last_scheduled_at: datetime | None = None

    @property
    def lateness(self) -> timedelta | None:
        return None if self.started_at is None else self.started_at - self.scheduled_at

    @property
    def duration(self) -> timedelta | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class Listener:
    """Hooks around runs. Subclass and override what you need; each method may be a plain
    function or ``async def``. Sync hooks run on the scheduler's event loop and must be quick;
    async hooks are started as tasks. An exception in a hook is logged and never stops the
    scheduler or the job."""

    def before_run(self, event: RunEvent) -> Any:
        """A run is about to start."""

    def after_success(self, event: RunEvent) -> Any:
        """A run returned normally."""

    def after_failure(self, event: RunEvent) -> Any:
        """A run raised; ``event.error`` is the exception."""

    def on_timeout(self, event: RunEvent) -> Any:
        """A run passed its timeout: called once, at the deadline, when the run is cancelled
        (async) or signalled through its cancel event (sync; ``finished_at`` is ``None`` as
        the thread may go on; its overrun is logged when it returns)."""

    def on_skipped(self, event: RunEvent) -> Any:
        """A tick was not run because of the overlap policy, the concurrency limit, or
        because the job is paused (``event.outcome`` says which)."""

    def on_missed(self, event: RunEvent) -> Any:
        """A tick was not run: coalesced into a later one, or dropped at shutdown. Past the
        enumeration bound, one call stands for a range of ticks (``event.ticks`` of them)."""

    def on_abandoned(self, event: RunEvent) -> Any:
        """A run was cut off (lost lock, shutdown timeout)."""

    def on_lock_error(self, event: RunEvent) -> Any:
        """The backend failed to claim, lock or record a tick; ``event.error`` says why."""

    def on_taken(self, event: RunEvent) -> Any:
        """Another replica claimed the tick first: it runs there, not here."""

    def on_started(self, replica_id: str) -> Any:
        """The scheduler started."""

    def on_stopped(self, replica_id: str) -> Any:
        """The scheduler stopped: every run ended or was cut off, every outcome written."""

    def on_leader_gained(self, replica_id: str) -> Any:
        """This replica became the leader: it claims the ticks of the leader-mode jobs."""

    def on_leader_lost(self, replica_id: str) -> Any:
        """This replica is no longer the leader (its lease ran out or went to another)."""

    def on_job_added(self, name: str) -> Any:
        """A job was added while the scheduler runs."""

    def on_job_updated(self, name: str) -> Any:
        """A job's trigger or options changed while the scheduler runs."""

    def on_job_removed(self, name: str) -> Any:
        """A job was removed while the scheduler runs."""
