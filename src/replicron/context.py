"""The run context: what a task can ask about the run it is in."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
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
    it was asked for, not a tick). ``lease_deadline`` is when the run's lock lease ends unless
    a heartbeat renews it (``time.monotonic()``; ``None`` without one): past it another replica
    may take the job over, so ``cancelled`` reads as set from then on, even before the
    scheduler has noticed (a process frozen and woken past it). ``stop_deadline`` is, once the
    scheduler is shutting down, when it cuts the run off (``time.monotonic()``; ``None``
    until then): a run that can wind down when asked has until then.
    """

    __slots__ = (
        "_event",
        "_lease_end",
        "_on_stop",
        "_stop",
        "_stop_by",
        "cancel_detail",
        "cancel_reason",
        "deadline",
        "job_name",
        "manual",
        "replica_id",
        "run_id",
        "scheduled_at",
    )

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
        self._lease_end: Callable[[], float | None] | None = None
        self._stop_by: float | None = None
        #: Told each new ``stop_deadline`` (on the scheduler's loop): a command job's task.
        self._on_stop: Callable[[float], None] | None = None

    @property
    def stop_deadline(self) -> float | None:
        return self._stop_by

    def _stopping(self, by: float) -> None:
        """The scheduler shuts down and cuts the run off at ``by`` (``time.monotonic()``),
        unless it said earlier already (a shutdown hurried moves it earlier)."""
        if self._stop_by is None or by < self._stop_by:
            self._stop_by = by
            if self._on_stop is not None:
                self._on_stop(by)

    @property
    def lease_deadline(self) -> float | None:
        lease_end = self._lease_end
        return None if lease_end is None else lease_end()

    @property
    def cancelled(self) -> threading.Event:
        event = self._event
        if event is None:
            with _EVENT_LOCK:
                if self._event is None:
                    lease_end = self._lease_end
                    self._event = threading.Event() if lease_end is None else _Leased(lease_end)
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

    def _past_lease_end(self) -> bool:
        """Whether the run was seen past its lease's end: ``cancelled`` read as set because of
        it, or the lease has ended by now. Such a run may overlap a takeover, so it is
        recorded ``abandoned`` whatever its task returned."""
        event, lease_end = self._event, self._lease_end
        if isinstance(event, _Leased) and event.expired:
            return True
        end = None if lease_end is None else lease_end()
        return end is not None and end <= time.monotonic()

    def __repr__(self) -> str:
        return (
            f"RunContext(job_name={self.job_name!r}, scheduled_at={self.scheduled_at!r}, "
            f"run_id={self.run_id!r}, replica_id={self.replica_id!r}, deadline={self.deadline!r}, "
            f"cancelled={self._stop}, cancel_reason={self.cancel_reason!r})"
        )


class _Leased(threading.Event):
    """``cancelled`` of a run under a lease: also set once the lease's end has passed, by the
    monotonic clock read when asked, whatever the scheduler's loop has seen."""

    def __init__(self, lease_end: Callable[[], float | None]) -> None:
        super().__init__()
        self._lease_end = lease_end
        #: ``cancelled`` was read as set because the lease had ended.
        self.expired = False

    def _left(self) -> float | None:
        end = self._lease_end()
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            # Final once read: a heartbeat that gets through later does not undo it for a
            # task that may already have stopped on it.
            self.expired = True
            super().set()
        return left

    def is_set(self) -> bool:
        if super().is_set():
            return True
        left = self._left()
        return left is not None and left <= 0

    def wait(self, timeout: float | None = None) -> bool:
        until = None if timeout is None else time.monotonic() + timeout
        while True:
            left = self._left()
            if left is not None and left <= 0:
                return True
            step = left
            if until is not None:
                remaining = until - time.monotonic()
                step = remaining if step is None else min(step, remaining)
            if step is not None and step <= 0:
                return super().is_set()
            # The lease may be renewed meanwhile: look again at its end every second at most.
            if super().wait(None if step is None else min(step, 1.0)):
                return True


_current: ContextVar[RunContext] = ContextVar("replicron_current_run")


def current_run() -> RunContext:
    """The :class:`RunContext` of the run calling this; raises :class:`NoCurrentRunError`
    outside a run."""
    try:
        return _current.get()
    except LookupError:
        raise NoCurrentRunError("current_run() was called outside a replicron job run") from None
