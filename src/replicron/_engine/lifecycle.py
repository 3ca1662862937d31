"""Where a scheduler is in its life, and what may be done with it there."""

from __future__ import annotations

import os
from typing import Literal

from replicron.errors import ForkedSchedulerError, SchedulerClosedError

__all__ = ["Lifecycle", "Phase"]

Phase = Literal["new", "running", "stopping", "stopped"]


class Lifecycle:
    """One scheduler's phase, read by every part of its engine and changed by the engine."""

    __slots__ = ("phase", "pid")

    def __init__(self) -> None:
        self.phase: Phase = "new"
        self.pid: int | None = None  # the process the scheduler was started in

    @property
    def running(self) -> bool:
        return self.phase == "running"

    def check_usable(self) -> None:
        if self.pid is not None and os.getpid() != self.pid:
            raise ForkedSchedulerError(
                f"this scheduler was started in process {self.pid} and cannot be used in "
                f"forked process {os.getpid()}: start schedulers after forking"
            )
        if self.phase in ("stopping", "stopped"):
            raise SchedulerClosedError("the scheduler was shut down")

    def begin(self) -> None:
        self.check_usable()
        if self.phase != "new":
            raise SchedulerClosedError("a scheduler can be started once")
        self.pid = os.getpid()
