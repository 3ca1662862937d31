"""Job registration and inspection: synchronous, thread-safe, shared by both scheduler faces."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any, Literal

from replicron.backends.base import Backend, Claim, PackedRecord, RunRecord, unpack_record
from replicron.clock import Clock
from replicron.errors import (
    ConfigurationError,
    DuplicateJobError,
    ForkedSchedulerError,
    InvalidJobOptionError,
    JobNotFoundError,
    PastInstantError,
    SchedulerClosedError,
)
from replicron.events import RunEvent
from replicron.jobs import Job, JobSpec, build_job_spec
from replicron.triggers import OneTimeTrigger

from .planner import Planner, Tick

__all__ = ["JobRegistry", "JobState"]


@dataclass(slots=True)
class JobState:
    spec: JobSpec
    handle: Job
    running: int = 0
    runs_started: int = 0
    pending: Claim | None = None  # overlap "queue": the one tick waiting for the current run
    backlog: deque[datetime] | None = None  # catch_up="all": ticks run one after another
    last_record: PackedRecord | None = None  # packed: one per job, kept for long
    last_error: BaseException | None = None
    last_detail: str | None = None


def event_of(
    record: RunRecord, error: BaseException | None = None, detail: str | None = None
) -> RunEvent:
    return RunEvent(
        record.job, record.scheduled_at, record.replica_id, record.run_id, record.outcome,
        record.started_at, record.finished_at, error, detail,
    )  # fmt: skip


class JobRegistry:
    """The jobs of a scheduler and their plan. Runs nothing; the engine builds on it."""

    clock: Clock
    timezone: tzinfo
    backend: Backend

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, JobState] = {}
        self._planner = Planner()
        self._immediate: list[Tick] = []
        self._catch_up_needed: list[str] = []
        self._state: Literal["new", "running", "stopping", "stopped"] = "new"
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._poke_pending = False

    # ---- registration (any thread) -----------------------------------------------------

    def check_usable(self) -> None:
        if self._pid is not None and os.getpid() != self._pid:
            raise ForkedSchedulerError(
                f"this scheduler was started in process {self._pid} and cannot be used in "
                f"forked process {os.getpid()}: start schedulers after forking"
            )
        if self._state in ("stopping", "stopped"):
            raise SchedulerClosedError("the scheduler was shut down")

    def add_job(self, spec: JobSpec) -> Job:
        self.check_usable()
        with self._lock:
            if spec.name in self._jobs:
                raise DuplicateJobError(f"a job named {spec.name!r} is already registered")
            self.backend.register_job(spec.name)
            state = self._jobs[spec.name] = JobState(spec, Job(self, spec.name))
            try:
                self._plan(state, check=True)
            except ConfigurationError:
                del self._jobs[spec.name]
                self.backend.unregister_job(spec.name)
                raise
            if self._state == "running":
                self._catch_up_needed.append(spec.name)
        self._poke()
        return state.handle

    def update_job(self, name: str, trigger: Any, options: dict[str, Any]) -> None:
        self.check_usable()
        with self._lock:
            state = self._state_of(name)
            old = state.spec
            fields: dict[str, Any] = {
                "name": name,
                "tags": old.tags,
                "overlap": old.overlap,
                "timeout": old.timeout,
                "start_at": old.start_at,
                "stop_at": old.stop_at,
                "max_runs": old.max_runs,
                "catch_up": old.catch_up,
                "misfire_grace": old.misfire_grace,
            }
            unknown = set(options) - set(fields) - {"name"}
            if unknown or "name" in options:
                bad = ", ".join(sorted(unknown | ({"name"} & set(options))))
                raise InvalidJobOptionError(f"job {name!r}: cannot update {bad}")
            fields.update(options)
            new_spec = build_job_spec(
                old.trigger if trigger is None else trigger,
                old.func,
                old.args,
                old.kwargs,
                default_tz=self.timezone,
                **fields,
            )
            state.spec = new_spec
            try:
                self._plan(state, check=True)
            except ConfigurationError:
                state.spec = old
                self._plan(state)
                raise
        self._poke()

    def remove_job(self, name: str) -> None:
        self.check_usable()
        with self._lock:
            self._state_of(name)
            del self._jobs[name]
            self.backend.unregister_job(name)
            self._planner.remove(name)
        self._poke()

    def remove_by_tag(self, tag: str) -> list[str]:
        with self._lock:
            names = [n for n, s in self._jobs.items() if tag in s.spec.tags]
            for name in names:
                self.remove_job(name)
        return names

    def jobs(self) -> list[Job]:
        with self._lock:
            return [s.handle for s in self._jobs.values()]

    def get_job(self, name: str) -> Job:
        with self._lock:
            return self._state_of(name).handle

    def spec(self, name: str) -> JobSpec:
        with self._lock:
            return self._state_of(name).spec

    def next_runs(self, name: str, count: int) -> list[datetime]:
        with self._lock:
            self._state_of(name)
            return self._planner.upcoming(name, count)

    def last_run(self, name: str) -> RunEvent | None:
        with self._lock:
            state = self._state_of(name)
            packed = state.last_record
            if packed is None:
                return None
            return event_of(unpack_record(packed), state.last_error, state.last_detail)

    def run_now(self, name: str) -> None:
        self.check_usable()
        with self._lock:
            self._state_of(name)
            self._immediate.append(Tick(name, self.clock.now()))
        self._poke()

    def _state_of(self, name: str) -> JobState:
        state = self._jobs.get(name)
        if state is None:
            raise JobNotFoundError(f"no job named {name!r}")
        return state

    def _plan(self, state: JobState, *, check: bool = False) -> None:
        """Plan the job from now; with ``check``, refuse a job that could never run."""
        spec = state.spec
        if spec.max_runs is not None and state.runs_started >= spec.max_runs:
            self._planner.remove(spec.name)
            return
        now = self.clock.now()
        first = self._planner.add(
            spec.name, spec.trigger, now, start_at=spec.start_at, stop_at=spec.stop_at
        )
        if first is None and check:
            self._planner.remove(spec.name)
            if isinstance(spec.trigger, OneTimeTrigger):
                raise PastInstantError(
                    f"job {spec.name!r}: every one-time instant is at or before now "
                    f"({now.isoformat()}), so it would never run"
                )
            raise InvalidJobOptionError(
                f"job {spec.name!r} would never run: its trigger has no tick after "
                f"{now.isoformat()}" + ("" if spec.stop_at is None else " and before stop_at")
            )

    def _poke(self) -> None:
        """Wake the engine after a change; one pending wake-up serves any number of calls."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or self._poke_pending or loop.is_closed():
            return
        self._poke_pending = True
        with contextlib.suppress(RuntimeError):  # loop closed in between
            loop.call_soon_threadsafe(self._poked)

    def _poked(self) -> None:
        self._poke_pending = False
        assert self._wake is not None
        self._wake.set()
