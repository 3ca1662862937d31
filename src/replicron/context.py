"""The run context: what a task can ask about the run it is in."""

from __future__ import annotations

import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime

from .errors import NoCurrentRunError

__all__ = ["RunContext", "current_run"]


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run a task is executing.

    ``scheduled_at`` is the tick (an aware UTC datetime) and, with ``job_name``, a natural
    idempotency key. ``run_id`` is a fencing token that increases with every run of the job
    (``None`` where the backend gives none). ``cancelled`` is set when the run should stop
    (timeout, shutdown, lost lock): sync tasks should poll or wait on it; async tasks are
    cancelled instead.
    """

    job_name: str
    scheduled_at: datetime
    run_id: int | None
    replica_id: str
    deadline: datetime | None
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)


_current: ContextVar[RunContext] = ContextVar("replicron_current_run")


def current_run() -> RunContext:
    """The :class:`RunContext` of the run calling this; raises :class:`NoCurrentRunError`
    outside a run."""
    try:
        return _current.get()
    except LookupError:
        raise NoCurrentRunError("current_run() was called outside a replicron job run") from None
