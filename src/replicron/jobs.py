"""The handle of a registered job, as ``add_job`` returns it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from ._engine.spec import JobSpec
from .events import RunEvent
from .triggers import Trigger

__all__ = ["Job", "JobControl"]


class JobControl(Protocol):
    """What a :class:`Job` handle asks of the scheduler that holds the job."""

    def spec(self, name: str, /) -> JobSpec: ...

    def next_runs(self, name: str, count: int, /) -> list[datetime]: ...

    def last_run(self, name: str, /) -> RunEvent | None: ...

    def run_now(self, name: str, /) -> None: ...

    def pause(self, name: str, /) -> bool: ...

    def resume(self, name: str, run_now: bool = False, /) -> bool: ...

    def update_job(
        self,
        name: str,
        trigger: Trigger | None,
        options: dict[str, Any],
        func: Callable[..., Any] | None,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        /,
    ) -> None: ...

    def remove_job(self, name: str, /) -> None: ...


class Job:
    """A registered job: a handle on the scheduler that runs it."""

    __slots__ = ("_engine", "name")

    def __init__(self, engine: JobControl, name: str) -> None:
        self._engine = engine
        self.name = name

    @property
    def spec(self) -> JobSpec:
        return self._engine.spec(self.name)

    @property
    def trigger(self) -> Trigger:
        return self.spec.trigger

    @property
    def tags(self) -> frozenset[str]:
        return self.spec.tags

    def next_run(self) -> datetime | None:
        """The next planned tick, or ``None`` if the job has no more."""
        runs = self._engine.next_runs(self.name, 1)
        return runs[0] if runs else None

    def next_runs(self, count: int) -> list[datetime]:
        return self._engine.next_runs(self.name, count)

    @property
    def last_run(self) -> RunEvent | None:
        """How this job's latest tick on this replica ended (``None`` before the first)."""
        return self._engine.last_run(self.name)

    def run_now(self) -> None:
        """Run the job once now (an extra tick at the current time), besides its schedule."""
        self._engine.run_now(self.name)

    def pause(self) -> bool:
        """Pause the job on every replica sharing the backend: from each replica's next
        claim, its ticks are recorded ``paused`` and none runs (a manual ``run_now`` still
        runs). Returns False if it was paused already. Blocks for one backend round trip."""
        return self._engine.pause(self.name)

    def resume(self, run_now: bool = False) -> bool:
        """Resume the paused job on every replica from its next tick; the ticks paused meanwhile
        are not replayed, unless ``run_now`` asks for one run at once in their place. Returns
        False if it was not paused."""
        return self._engine.resume(self.name, run_now)

    def update(
        self,
        trigger: Trigger | None = None,
        *,
        func: Callable[..., Any] | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Change the trigger, the task and/or options (same names as ``add_job``) in place;
        validated like a new job, and replanned from now. ``func``, ``args`` (a list or
        tuple) and ``kwargs`` each replace that part of the task where given, and the task is
        bound against its function again. The job's runs going on are not touched, and still
        count for its overlap policy and ``max_runs``."""
        self._engine.update_job(self.name, trigger, options, func, args, kwargs)
        return self

    def remove(self) -> None:
        self._engine.remove_job(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other._engine is self._engine and other.name == self.name

    def __hash__(self) -> int:
        return hash((id(self._engine), self.name))

    def __repr__(self) -> str:
        return f"Job({self.name!r}, {self.trigger!r})"
