"""This replica's part in the cluster's job registry, and the cluster's status for whoever
watches it (metrics, say).

A backend shared by replicas keeps a registry of the jobs each replica schedules (see
:mod:`replicron.cluster`). The watch writes this replica's definitions there when the
scheduler starts and whenever one changes: a new job, a changed trigger or options, or the
next tick the replica expects. It also rereads them now and then, so a job that silently
stopped running shows as overdue to anyone who reads the database, and it warns once about
each other replica that registers one of its jobs differently (definition drift: the cluster
then runs both schedules).

It also polls for manual runs asked for across the cluster (``replicron run-now``, the
Django admin) and hands them to the registry as manual runs of this replica's jobs.

Its cadence is real time, whatever the scheduler's clock: the registry is for operators, and
a test's fake clock must not see an extra sleeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from replicron.backends.base import ClusterRegistry, RunRequests
from replicron.cluster import (
    DEFAULT_OVERDUE_GRACE,
    MOST_EXPECTED,
    ClusterStatus,
    JobDefinition,
    Registration,
)
from replicron.errors import JobNotFoundError

from .health import BackendHealth
from .observe import Observer
from .planner import Tick
from .registry import JobRegistry, JobState
from .spec import JobSpec
from .wakeup import Wakeup

__all__ = ["ClusterWatch", "fingerprint_of", "trigger_text"]

_WARNING = logging.WARNING
#: Seconds between looks at what changed (next ticks, mostly); a write only if anything did.
LOOK_EVERY = 10.0
#: Seconds after which the registry is written (and drift checked) even if nothing changed.
REWRITE_EVERY = 60.0
#: Seconds a change waits before it is written, so that jobs added in bulk go in one write.
SETTLE = 0.5
#: A job's expected ticks reach this far ahead when written, and are written again when
#: less than half of it is left: a replica that dies leaves a reader enough to go on.
HORIZON = timedelta(minutes=2)
#: Seconds between polls for manual runs asked for across the cluster: how late such a run
#: starts at most (one indexed read per replica each time).
REQUESTS_EVERY = 2.0
#: Seconds the last write may take at shutdown.
LAST_WRITE = 2.0
_ADDRESS = re.compile(r" at 0x[0-9a-f]+", re.I)
#: What the watch does with the backend, as told to its health.
_WRITING = "writing this replica's jobs to the registry"
_READING_REQUESTS, _READING_STATUS = "reading the manual runs asked for", "reading the status"

StatusCallback = Callable[[ClusterStatus | None], None]


def trigger_text(spec: JobSpec) -> str:
    """The trigger as a person reads it, ``str(trigger)``: ``every 5s``, ``cron('*/5 * * *
    *', tz='Europe/Kyiv')`` (a trigger's ``__str__`` is its ``__repr__`` unless it says
    otherwise). What the status page, ``replicron status --json`` and the admin show."""
    return _ADDRESS.sub("", str(spec.trigger))


def _stable_repr(trigger: object) -> str:
    """``repr(trigger)`` without memory addresses: a trigger of one's own without a
    ``__repr__`` is the same on every replica."""
    return _ADDRESS.sub("", repr(trigger))


def _grace(spec: JobSpec) -> timedelta:
    return spec.misfire_grace if spec.misfire_grace is not None else DEFAULT_OVERDUE_GRACE


def fingerprint_of(spec: JobSpec) -> str:
    """A digest of what shapes the job's ticks and runs (not its arguments' values)."""
    func = spec.func
    where = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', type(func))}"
    shape = (
        _stable_repr(spec.trigger),
        spec.overlap,
        spec.timeout,
        spec.start_at,
        spec.stop_at,
        spec.max_runs,
        spec.catch_up,
        spec.misfire_grace,
        where,
        spec.is_async,
    )
    return hashlib.sha256(repr(shape).encode()).hexdigest()[:16]


def _runs_left(state: JobState) -> int:
    """At most this many more ticks of the job: its max_runs less the runs this replica
    started (the other replicas' count too, so the cluster may have fewer left)."""
    limit = state.spec.max_runs
    return MOST_EXPECTED if limit is None else max(0, limit - state.runs_started)


class ClusterWatch:
    def __init__(
        self, backend: object, registry: JobRegistry, observer: Observer, health: BackendHealth
    ) -> None:
        self._backend = backend if isinstance(backend, ClusterRegistry) else None
        self._registry, self._observer, self._health = registry, observer, health
        self._written: dict[str, JobDefinition] = {}
        self._fingerprints: dict[str, tuple[JobSpec, str]] = {}
        self._removed: set[str] = set()
        self._written_at = 0.0
        self._drift_seen: set[tuple[str, str, str]] = set()
        self._watchers: dict[int, tuple[StatusCallback, float]] = {}
        self._last_read = -math.inf  # never read yet
        self._task: asyncio.Task[None] | None = None
        self._requests = backend if isinstance(backend, RunRequests) else None
        self._requests_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        #: Tells the loop of added or updated jobs (``changed_soon``).
        self._change_told = Wakeup()

    @property
    def supported(self) -> bool:
        return self._backend is not None

    async def start(self) -> None:
        """Write this replica's jobs, then keep them fresh in the background."""
        if self._backend is None:
            return
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        try:
            await self._announce(force=True)
        except Exception as exc:  # the scheduler runs without it; the loop tries again
            self._failed(exc)
        self._task = self._loop.create_task(self._run(), name="replicron-cluster-watch")
        if self._requests is not None:
            self._requests_task = self._loop.create_task(
                self._poll_requests(self._requests), name="replicron-run-requests"
            )

    async def stop(self) -> None:
        """Stop the background writes (the rows stay: with every replica down, they are what
        tells a reader which ticks are overdue)."""
        if self._task is None:
            return
        for task in (self._task, self._requests_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._requests_task = None
        # The ticks expected from now on, as the last word: with nobody left to run them, a
        # reader sees the job overdue once the next one's grace has passed.
        try:
            await asyncio.wait_for(self._announce(force=False), LAST_WRITE)
        except Exception as exc:
            self._failed(exc)

    def job_changed(self, hook: str, name: str) -> None:
        """A job was added, updated or removed (on the loop)."""
        if hook == "on_job_removed":
            self._removed.add(name)
        if self._changed is not None:
            self._changed.set()

    def changed_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """A job was added or updated (any thread): the loop is told once for any number of
        them, so that jobs added in bulk do not wake it each time."""
        if self._changed is not None:
            self._change_told(loop, self._changed)

    def watch(self, callback: StatusCallback, every: float) -> Callable[[], None]:
        """Call ``callback`` (on the loop) with the cluster's status every ``every`` seconds,
        with ``None`` when it could not be read; returns the function that stops it."""
        key = id(callback)
        self._watchers[key] = (callback, every)
        self._last_read = -math.inf  # never read yet
        if self._changed is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._changed.set)
        return lambda: self._watchers.pop(key, None) and None

    async def _run(self) -> None:
        assert self._changed is not None
        # After a failed write, or a pause of the whole process (frozen, suspended), every row
        # is written again: meanwhile the others may have taken this replica for gone and an
        # operator forgotten its jobs.
        rewrite = False
        while True:
            period = min([LOOK_EVERY, *(every for _, every in self._watchers.values())])
            began = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), period)
                await self._settled()
            self._changed.clear()
            if time.monotonic() - began > 2 * (period + SETTLE):
                rewrite = True
            try:
                await self._announce(force=rewrite)
                rewrite = False
            except Exception as exc:
                rewrite = True
                self._failed(exc)
            if self._watchers:
                await self._read()

    async def _settled(self) -> None:
        """Until the jobs stop changing for ``SETTLE`` (at most ``LOOK_EVERY``): jobs added
        in bulk are announced once, after the last of them, not once per pause of the
        adding thread (each look walks every job)."""
        assert self._changed is not None
        until = time.monotonic() + LOOK_EVERY
        while time.monotonic() < until:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), SETTLE)
            except TimeoutError:
                return

    async def _poll_requests(self, backend: RunRequests) -> None:
        """Hand each manual run asked for across the cluster to the registry once, until some
        replica recorded it (then it is no longer pending)."""
        handed: dict[tuple[str, datetime], Tick | None] = {}
        registry = self._registry
        while True:
            jobs = [state.spec.name for state in registry.states()]
            try:
                pending = await backend.run_requests(jobs) if jobs else []
                if jobs:
                    self._health.answered(_READING_REQUESTS)
            except Exception as exc:
                self._health.failed(exc, _READING_REQUESTS)
                pending = list(handed)  # nothing is known done
            registry.requests_done(handed.pop(done) for done in handed.keys() - set(pending))
            new = [request for request in pending if request not in handed]
            if new:
                handed.update(zip(new, registry.run_requested(new), strict=True))
            await asyncio.sleep(REQUESTS_EVERY)

    async def _announce(self, *, force: bool) -> None:
        assert self._backend is not None
        registry = self._registry
        now = registry.clock.now()
        current = {}
        for state in registry.states():
            spec = state.spec
            written = self._written.get(spec.name)
            fingerprint = self._fingerprint(spec)
            try:
                if (
                    written is not None
                    and written.fingerprint == fingerprint
                    and (not written.expected or written.expected[-1] >= now + HORIZON / 2)
                    # a job that has no more ticks (its max_runs reached) says so at once;
                    # only a limited one can run out between two looks without its
                    # expected ticks passing (asked of every job, the look costs a walk
                    # of each trigger: seconds of CPU every look with 100,000 jobs)
                    and (
                        not written.expected
                        or spec.max_runs is None
                        or registry.next_runs(spec.name, 1)
                    )
                ):
                    current[spec.name] = written
                    continue
                expected = self._expected(spec.name, now, _runs_left(state))
            except JobNotFoundError:  # removed meanwhile
                continue
            current[spec.name] = JobDefinition(
                spec.name, trigger_text(spec), fingerprint, _grace(spec), expected
            )
        changed = [d for name, d in current.items() if self._written.get(name) != d]
        for gone in self._fingerprints.keys() - current.keys():
            del self._fingerprints[gone]
        removed = sorted(self._removed - set(current))
        stale = time.monotonic() - self._written_at >= REWRITE_EVERY
        if not (changed or removed or force or stale):
            return
        complete = force or stale
        if complete:  # every row: last_seen says it is current, and no row of another is left
            changed = list(current.values())
        drift = await self._backend.announce(changed, removed, complete)
        self._health.answered(_WRITING)
        self._written = current
        self._removed -= set(removed)
        self._written_at = time.monotonic()
        self._warn_of(drift, current)

    def _fingerprint(self, spec: JobSpec) -> str:
        known = self._fingerprints.get(spec.name)
        if known is None or known[0] is not spec:
            known = self._fingerprints[spec.name] = (spec, fingerprint_of(spec))
        return known[1]

    def _expected(self, name: str, now: datetime, runs_left: int) -> tuple[datetime, ...]:
        """The job's next ticks: at least two (if it has them) and those within the
        horizon, at most MOST_EXPECTED, and no more than the runs it has left."""
        most = min(MOST_EXPECTED, runs_left)
        if most <= 0:
            return ()
        count, until = min(2, most), now + HORIZON
        while True:
            ticks = self._registry.next_runs(name, count)
            if len(ticks) < count or ticks[-1] > until or count >= most:
                break
            count = min(most, count * 4)
        return tuple(tick for n, tick in enumerate(ticks) if n < 2 or tick <= until)

    def _warn_of(self, drift: list[Registration], mine: dict[str, JobDefinition]) -> None:
        for other in drift:
            key = (other.job, other.replica_id, other.fingerprint)
            own = mine.get(other.job)
            if key in self._drift_seen or own is None:
                continue
            self._drift_seen.add(key)
            self._observer.log(
                _WARNING,
                "drift",
                f"replica {other.replica_id} schedules this job as "
                f"{other.trigger} (definition {other.fingerprint}) and this replica as "
                f"{own.trigger} (definition {own.fingerprint}): the cluster runs the ticks of "
                "both; deploy one definition everywhere",
                other.job,
            )

    async def _read(self) -> None:
        assert self._backend is not None
        now = time.monotonic()
        every = min(every for _, every in self._watchers.values())
        if now - self._last_read < every * 0.9:
            return
        self._last_read = now
        status: ClusterStatus | None
        try:
            status = await self._backend.cluster_status()
        except Exception as exc:
            self._health.failed(exc, _READING_STATUS)
            status = None
        else:
            self._health.answered(_READING_STATUS)
        for callback in [cb for cb, _ in self._watchers.values()]:
            try:
                callback(status)
            except Exception:
                self._observer.logger.exception("a cluster status watcher failed")

    def _failed(self, exc: Exception) -> None:
        self._health.failed(exc, _WRITING)
