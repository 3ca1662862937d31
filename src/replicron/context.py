"""The run context: what a task can ask about the run it is in."""

from __future__ import annotations

import enum
import threading
from contextvars import ContextVar
from datetime import datetime

from .errors import NoCurrentRunError

__all__ = ["CancelReason", "RunContext", "current_run"]

# Creating a threading.Event costs more than the rest of a run's bookkeeping, and most runs
# never look at theirs: it is made on first use, under this lock.
_EVENT_LOCK = threading.Lock()


class CancelReason(enum.StrEnum):
    """Why a run was asked to stop (:attr:`RunContext.cancel_reason`)."""

    #: It passed its ``timeout``; it is recorded ``timed_out``.
    TIMEOUT = "timeout"
    #: The scheduler shut down before the run returned; it is recorded ``abandoned``.
    SHUTDOWN = "shutdown"
    #: Its lock or lease was lost: another replica may start the job before long, so it must
    #: stop at once. It is recorded ``abandoned``.
    LOCK_LOST = "lock_lost"


#: A later reason replaces an earlier one only if it asks for more: a run past its timeout
#: that then loses its lock must stop at once.
_URGENCY = {CancelReason.TIMEOUT: 0, CancelReason.SHUTDOWN: 1, CancelReason.LOCK_LOST: 2}


class RunContext:
    """The run a task is executing.

    ``scheduled_at`` is the tick (an aware UTC datetime) and, with ``job_name``, a natural
    idempotency key. ``run_id`` is a fencing token that increases with every run of the job
    (``None`` where the backend gives none). ``cancelled`` is a ``threading.Event`` set when
    the run should stop (timeout, shutdown, lost lock): sync tasks should poll or wait on it;
    async tasks are cancelled instead. ``cancel_reason`` says why it was asked to stop (a
    :class:`CancelReason`, ``None`` until it is) and ``cancel_detail`` says it in words.
    ``manual`` is true for a run asked for with ``Job.run_now`` (its ``scheduled_at`` is when
    it was asked for, not a tick).
    """

    __slots__ = (
        "_event", "_stop", "cancel_detail", "cancel_reason", "deadline", "job_name", "manual",
        "replica_id", "run_id", "scheduled_at",
    )  # fmt: skip

    def __init__(
        self,
        job_name: str,
        scheduled_at: datetime,
        run_id: int | None,
        replica_id: str,
        deadline: datetime | None,
        manual: bool = False,
    ) -> None:
        self.job_name = job_name
        self.scheduled_at = scheduled_at
        self.run_id = run_id
        self.replica_id = replica_id
        self.deadline = deadline
        self.manual = manual
        self.cancel_reason: CancelReason | None = None
        self.cancel_detail: str | None = None
        self._event: threading.Event | None = None
        self._stop = False

    @property
    def cancelled(self) -> threading.Event:
        event = self._event
        if event is None:
            with _EVENT_LOCK:
                if self._event is None:
                    self._event = threading.Event()
                    if self._stop:
                        self._event.set()
                event = self._event
        return event

    def cancel(self, reason: CancelReason | None = None, detail: str | None = None) -> None:
        """Ask the run to stop (the scheduler calls this), for ``reason`` unless it was asked
        already for a more urgent one."""
        with _EVENT_LOCK:
            current = self.cancel_reason
            if reason is not None and (current is None or _URGENCY[reason] >= _URGENCY[current]):
                self.cancel_reason, self.cancel_detail = reason, detail
            self._stop = True
            if self._event is not None:
                self._event.set()

    def __repr__(self) -> str:
        return (
            f"RunContext(job_name={self.job_name!r}, scheduled_at={self.scheduled_at!r}, "
            f"run_id={self.run_id!r}, replica_id={self.replica_id!r}, deadline={self.deadline!r}, "
            f"cancelled={self._stop}, cancel_reason={self.cancel_reason!r})"
        )


_current: ContextVar[RunContext] = ContextVar("replicron_current_run")


def current_run() -> RunContext:
    """The :class:`RunContext` of the run calling this; raises :class:`NoCurrentRunError`
    outside a run."""
    try:
        return _current.get()
    except LookupError:
        raise NoCurrentRunError("current_run() was called outside a replicron job run") from None
