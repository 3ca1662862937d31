"""The jobs of a scheduler and their plan: registration and inspection from any thread, and
the ticks they make due, for the engine's loop. Runs nothing."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any

from replicron._schedule.tz import MICROSECOND
from replicron.backends.base import (
    Backend,
    Claim,
    LastFinish,
    LastFinishes,
    PackedRecord,
    RunRecord,
    unpack_record,
)
from replicron.clock import Clock
from replicron.errors import (
    ConfigurationError,
    DuplicateJobError,
    InvalidJobArgumentsError,
    InvalidJobOptionError,
    JobNotFoundError,
    PastInstantError,
)
from replicron.events import RunEvent
from replicron.triggers import FixedDelayTrigger, OneTimeTrigger, Trigger

from .cluster_calls import blocking, registry_of
from .lifecycle import Lifecycle
from .planner import Decision, Planner, Tick
from .spec import JobSpec, build_job_spec

__all__ = ["JobRegistry", "JobState", "event_of"]

#: The options ``Job.update`` may change, and the spec fields they come from.
_UPDATABLE = (
    "tags",
    "overlap",
    "timeout",
    "start_at",
    "stop_at",
    "max_runs",
    "catch_up",
    "misfire_grace",
    "leader",
)

#: Microseconds a manual run's instant moves at most to step off the job's ticks.
_MANUAL_STEPS = 1000


@dataclass(slots=True)
class JobState:
    spec: JobSpec
    running: int = 0
    runs_started: int = 0
    #: Runs counted against ``max_runs`` that may yet be missed on their thread: until they
    #: start, the backend's count of runs may be one too high.
    may_miss: int = 0
    pending: Claim | None = None  # overlap "queue": the one tick waiting for the current run
    # Overlap "queue": manual runs waiting for the current run, in the order asked for. Each
    # was asked for on purpose: none replaces another or the queued tick.
    pending_manual: deque[Claim] | None = None
    # catch_up="all": the ticks caught up, claimed at once and run one after another, oldest
    # first, each taking the job's lock when its turn comes (as a queued tick does).
    backlog: deque[Claim] | None = None
    last_record: PackedRecord | None = None  # packed: one per job, kept for long
    last_error: BaseException | None = None
    last_detail: str | None = None
    last_manual: datetime | None = None  # the instant of the latest manual run asked for


def event_of(
    record: RunRecord, error: BaseException | None = None, detail: str | None = None
) -> RunEvent:
    return RunEvent(
        record.job,
        record.scheduled_at,
        record.replica_id,
        record.run_id,
        record.outcome,
        record.started_at,
        record.finished_at,
        error,
        detail,
        record.manual,
        record.ticks,
        record.through,
    )


class JobRegistry:
    """Thread-safe: registration may come from any thread while the engine's loop plans.

    ``wake`` is called after every change that may move the next wake-up; ``life`` says
    whether the scheduler may still be used and whether it is running.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        timezone: tzinfo,
        backend: Backend,
        life: Lifecycle,
        wake: Callable[[], None],
        changed: Callable[[str, str], None] = lambda hook, name: None,
        replica_id: str = "",
    ) -> None:
        self.clock, self.timezone, self.replica_id = clock, timezone, replica_id
        self._backend, self._life, self._wake = backend, life, wake
        self._changed = changed  # (listener hook, job name), after a change while running
        #: Told (on the loop) of a job that reached its max_runs.
        self.retired: Callable[[str], None] = lambda name: None
        self._lock = threading.RLock()
        self._jobs: dict[str, JobState] = {}
        self._planner = Planner()
        self._manual: list[Tick] = []  # manual runs (run_now) asked for
        self._requested: set[Tick] = set()  # those asked for across the cluster
        self._catch_up_needed: list[str] = []  # jobs whose ticks missed while down to look up
        #: The state of a job, or None; lock-free (a dict lookup is atomic), for the hot path.
        self.get: Callable[[str], JobState | None] = self._jobs.get

    def __len__(self) -> int:
        return len(self._jobs)

    # ---- registration and inspection (any thread) --------------------------------------

    def add_job(self, spec: JobSpec) -> None:
        self._life.check_usable()
        with self._lock:
            if spec.name in self._jobs:
                raise DuplicateJobError(f"a job named {spec.name!r} is already registered")
            self._backend.register_job(spec.name)
            state = self._jobs[spec.name] = JobState(spec)
            try:
                self._plan(state, check=True)
            except ConfigurationError:
                del self._jobs[spec.name]
                self._backend.unregister_job(spec.name)
                raise
            if self._life.running:
                self._catch_up_needed.append(spec.name)
        self._wake()
        self._changed("on_job_added", spec.name)

    def update_job(
        self,
        name: str,
        trigger: Trigger | None,
        options: dict[str, Any],
        func: Callable[..., Any] | None = None,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Change a job in place: its run-time state (runs going on, so no overlap with
        them; runs so far) stays. ``func``, ``args`` and ``kwargs``, where given, replace
        those of its task, which is bound against its function again."""
        self._life.check_usable()
        with self._lock:
            state = self._state_of(name)
            old = state.spec
            bad = sorted(set(options) - set(_UPDATABLE))
            if bad:
                raise InvalidJobOptionError(f"job {name!r}: cannot update {', '.join(bad)}")
            fields: dict[str, Any] = {field: getattr(old, field) for field in _UPDATABLE}
            fields.update(options)
            state.spec = build_job_spec(
                old.trigger if trigger is None else trigger,
                old.func if func is None else func,
                old.args if args is None else _arguments(name, args),
                old.kwargs if kwargs is None else _keyword_arguments(name, kwargs),
                name=name,
                default_tz=self.timezone,
                **fields,
            )
            try:
                self._plan(state, check=True)
            except ConfigurationError:
                state.spec = old
                self._plan(state)
                raise
        self._wake()
        self._changed("on_job_updated", name)

    def remove_job(self, name: str) -> None:
        self._life.check_usable()
        with self._lock:
            self._state_of(name)
            del self._jobs[name]
            self._backend.unregister_job(name)
            self._planner.remove(name)
        self._wake()
        self._changed("on_job_removed", name)

    def remove_by_tag(self, tag: str) -> list[str]:
        with self._lock:
            names = [n for n, s in self._jobs.items() if tag in s.spec.tags]
            for name in names:
                self.remove_job(name)
        return names

    def names(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

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

    def pause(self, name: str) -> bool:
        """Pause the job across the cluster (see ``Job.pause``)."""
        self._state_of(name)
        return blocking(registry_of(self._backend, "pause").pause(name, self.replica_id))

    def resume(self, name: str, run_now: bool = False) -> bool:
        """Resume the job across the cluster (see ``Job.resume``)."""
        self._state_of(name)
        resumed = blocking(registry_of(self._backend, "resume").resume(name))
        if run_now:
            self.run_now(name)
        return resumed

    def run_now(self, name: str) -> None:
        self._life.check_usable()
        with self._lock:
            state = self._state_of(name)
            self._manual.append(Tick(name, self._manual_instant(state, self.clock.now())))
        self._wake()

    def _manual_instant(self, state: JobState, at: datetime) -> datetime:
        """The instant a manual run of ``state``'s job is recorded at: ``at``, or the first
        microsecond after it that is neither a tick of the job's trigger nor an earlier
        manual run's instant. Manual runs share the ledger's unique ``(job, instant)`` with
        the ticks, so a run asked for at a tick's very instant must not take the tick."""
        last = state.last_manual
        if last is not None and at <= last:
            at = last + MICROSECOND
        at = _off_ticks(state.spec, at)
        state.last_manual = at
        return at

    def run_requested(self, requests: Sequence[tuple[str, datetime]]) -> list[Tick | None]:
        """Manual runs asked for across the cluster: each claimed at the instant asked for,
        moved off the job's ticks alike on every replica, so that the ledger's unique tick
        runs it once; one that another replica took is done. Returns their ticks (None for
        a job no longer here)."""
        ticks = []
        with self._lock:
            for job, at in requests:
                state = self._jobs.get(job)
                tick = Tick(job, _off_ticks(state.spec, at.astimezone(UTC))) if state else None
                if tick is not None:
                    self._requested.add(tick)
                    self._manual.append(tick)
                ticks.append(tick)
        self._wake()
        return ticks

    def requests_done(self, ticks: Iterable[Tick | None]) -> None:
        """Manual runs asked for across the cluster that some replica recorded."""
        with self._lock:
            self._requested.difference_update(ticks)

    def manual_taken(self, tick: Tick) -> None:
        """Another replica recorded something at a manual run's instant (its own manual run
        asked for at the same microsecond): the run is asked for again just after it."""
        with self._lock:
            state = self._jobs.get(tick.job)
            if tick in self._requested:  # asked for across the cluster: another replica ran it
                self._requested.discard(tick)
            elif state is not None:
                self._manual.append(Tick(tick.job, self._manual_instant(state, tick.scheduled_at)))
        self._wake()

    def manual_again(self, ticks: list[Tick]) -> None:
        """Manual runs whose claim failed with the backend: asked for again at the same
        instants (a claim committed unheard is then recognised as this replica's)."""
        with self._lock:
            self._manual[:0] = ticks

    def drop_manual(self) -> list[Tick]:
        """At shutdown: the manual runs asked for and not yet claimed."""
        with self._lock:
            dropped, self._manual = self._manual, []
        return dropped

    # ---- for the engine's loop ---------------------------------------------------------

    def start(self) -> None:
        """Plan every job from now, and ask for each one's missed ticks to be looked up."""
        with self._lock:
            for state in self._jobs.values():
                self._plan(state)
            self._catch_up_needed.extend(self._jobs)

    def take_due(self, now: datetime) -> tuple[Decision, list[str], list[Tick]]:
        """The planner's decision at ``now``, the jobs to catch up, the manual runs asked
        for."""
        with self._lock:
            decision = self._planner.decide(now)
            catch_up, self._catch_up_needed = self._catch_up_needed, []
            manual, self._manual = self._manual, []
        return decision, catch_up, manual

    def catch_up_later(self, names: list[str]) -> None:
        with self._lock:
            self._catch_up_needed.extend(names)

    def retire(self, name: str, state: JobState) -> None:
        """Plan no more ticks of ``name`` (it reached ``max_runs``), unless it is no longer
        the job of ``state`` (removed, and a job of that name added since)."""
        with self._lock:
            planned = self._jobs.get(name) is state and self._planner.remove(name)
        if planned:  # told once, however many of its runs or claims find it done
            self.retired(name)

    def wake_at(self) -> datetime | None:
        with self._lock:
            return self._planner.wake_at()

    def prepare(self) -> list[Tick]:
        """Work out the next instant's ticks ahead of it (see ``Planner.prepare``); returns
        every tick prepared so far for that instant."""
        with self._lock:
            self._planner.prepare()
            return self._planner.prepared()

    def chains_to_read(self, now: datetime) -> list[str]:
        """Fixed-delay jobs whose last finish to read from the ledger now."""
        with self._lock:
            return self._planner.chains_to_read(now)

    def chains_learned(
        self, jobs: Sequence[str], found: Mapping[str, LastFinish], now: datetime
    ) -> None:
        """What the ledger holds of fixed-delay ``jobs`` (those not in ``found`` have no row)."""
        with self._lock:
            for job in jobs:
                self._planner.learn(job, found.get(job), now)

    def chain_read_at(self) -> datetime | None:
        with self._lock:
            return self._planner.chain_read_at()

    def chain_left(self, job: str) -> bool:
        """A standby left the tick of a leader-mode job to the leader (see ``Planner``):
        whether the job's fixed-delay chain takes it up again once this replica leads."""
        with self._lock:
            return self._planner.left_to_leader(job)

    def chains_retaken(self, jobs: Iterable[str]) -> None:
        """This replica now leads ``jobs``: the fixed-delay ticks it left are planned again."""
        now = self.clock.now()
        with self._lock:
            for job in jobs:
                self._planner.retake(job, now)

    def chains_finished(self, states: Sequence[JobState | None]) -> None:
        """Outcomes of these jobs were written: a fixed-delay one reads its finish at once."""
        now, planner, woken = self.clock.now(), self._planner, False
        with self._lock:
            for state in states:
                if state is not None and isinstance(state.spec.trigger, FixedDelayTrigger):
                    planner.finished_here(state.spec.name, now)
                    woken = True
        if woken:
            self._wake()

    def states(self) -> Iterator[JobState]:
        """Every job's state; on the loop (a snapshot, so registration may go on)."""
        with self._lock:
            return iter(list(self._jobs.values()))

    # ---- helpers -----------------------------------------------------------------------

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
        if (
            check
            and isinstance(spec.trigger, FixedDelayTrigger)
            and not isinstance(self._backend, LastFinishes)
        ):
            raise InvalidJobOptionError(
                f"job {spec.name!r}: trigger {spec.trigger!r} follows the last finish in the "
                f"ledger, which {type(self._backend).__name__} cannot read (no last_finishes)"
            )
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


def _arguments(job: str, args: Sequence[Any]) -> tuple[Any, ...]:
    """``args`` of an update: a list or tuple (a string would be taken apart silently)."""
    if not isinstance(args, list | tuple):
        raise InvalidJobArgumentsError(
            f"job {job!r}: args must be a list or tuple of arguments, not {args!r}"
        )
    return tuple(args)


def _keyword_arguments(job: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidJobArgumentsError(
            f"job {job!r}: kwargs must be a mapping of argument names to values, not {kwargs!r}"
        )
    return dict(kwargs)


def _off_ticks(spec: JobSpec, at: datetime) -> datetime:
    """``at``, or the first microsecond after it that is not a tick of the job's trigger."""
    next_after = spec.trigger.next_after
    for _ in range(_MANUAL_STEPS):  # (a trigger ticking every microsecond has no gap)
        if next_after(at - MICROSECOND) != at:
            break
        at += MICROSECOND
    return at
