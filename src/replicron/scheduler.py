"""The two faces of one engine: ``AsyncScheduler`` for asyncio, ``Scheduler`` for threads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta, tzinfo
from types import TracebackType
from typing import Any, TypeVar

from ._engine.cluster_calls import blocking, registry_of
from ._engine.engine import ConcurrencyMode, Engine
from ._engine.planner import CatchUp, OverlapPolicy
from ._engine.spec import build_job_spec
from ._schedule.tz import UTC, resolve_zone
from .backends.base import Backend
from .backends.memory import MemoryBackend
from .clock import Clock, SystemClock
from .cluster import ClusterStatus
from .errors import InvalidJobOptionError, SchedulerClosedError
from .events import Listener
from .jobs import Job
from .keys import check_replica_id
from .triggers import Trigger

__all__ = ["AsyncScheduler", "Scheduler"]

F = TypeVar("F", bound=Callable[..., Any])
#: Where a scheduler's records go: runs, outcomes, backend errors (``extra`` names the job,
#: tick, replica and run).
_logger = logging.getLogger(__name__)
#: Worker threads for sync jobs: I/O-bound jobs mostly wait, so more than the cores
#: (docs/scheduler.md, "Worker threads").
_DEFAULT_WORKERS = 10


def _check_listener(listener: object) -> Listener:
    if not isinstance(listener, Listener):
        raise InvalidJobOptionError(
            f"listeners must be replicron.Listener instances, not {listener!r}"
        )
    return listener


def _check_stop_timeout(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidJobOptionError(
            f"stop_timeout must be a finite number of seconds >= 0, not {value!r}"
        )
    return float(value)


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _JobsAPI:
    """Registration and inspection, shared verbatim by both faces (thread-safe)."""

    _engine: Engine

    def __init__(
        self,
        *,
        timezone: str | tzinfo = "UTC",
        clock: Clock | None = None,
        backend: Backend | None = None,
        replica_id: str | None = None,
        max_concurrent_jobs: int | None = None,
        concurrency_mode: ConcurrencyMode = "queue",
        stop_timeout: float = 30.0,
        listeners: Sequence[Listener] = (),
        max_workers: int = _DEFAULT_WORKERS,
        defer_gc: bool = False,
        leader: bool = False,
    ) -> None:
        zone = resolve_zone(timezone)
        if max_concurrent_jobs is not None and (
            isinstance(max_concurrent_jobs, bool)
            or not isinstance(max_concurrent_jobs, int)
            or max_concurrent_jobs < 1
        ):
            raise InvalidJobOptionError(
                f"max_concurrent_jobs must be a whole number of at least 1, "
                f"not {max_concurrent_jobs!r}"
            )
        if concurrency_mode not in ("queue", "skip"):
            raise InvalidJobOptionError(
                f"concurrency_mode must be 'queue' or 'skip', not {concurrency_mode!r}"
            )
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidJobOptionError(f"max_workers must be at least 1, not {max_workers!r}")
        if not isinstance(defer_gc, bool):
            raise InvalidJobOptionError(f"defer_gc must be True or False, not {defer_gc!r}")
        if not isinstance(leader, bool):
            raise InvalidJobOptionError(f"leader must be True or False, not {leader!r}")
        if clock is not None and not isinstance(clock, Clock):
            raise InvalidJobOptionError(
                f"clock must be a replicron Clock (SystemClock(), FakeClock(), ...), not {clock!r}"
            )
        if replica_id is not None:
            check_replica_id(replica_id)
        for listener in listeners:
            _check_listener(listener)
        self._engine = Engine(
            clock=SystemClock() if clock is None else clock,
            backend=MemoryBackend() if backend is None else backend,
            timezone=UTC if zone is None else zone,
            replica_id=default_replica_id() if replica_id is None else replica_id,
            max_concurrent_jobs=max_concurrent_jobs,
            concurrency_mode=concurrency_mode,
            stop_timeout=_check_stop_timeout(stop_timeout),
            listeners=list(listeners),
            max_workers=max_workers,
            defer_gc=defer_gc,
            logger=_logger,
        )
        self._engine.leadership.by_default(leader)
        self._init_face()

    def _init_face(self) -> None:
        """What a face adds to the shared state (the thread-based one: its thread)."""

    @property
    def replica_id(self) -> str:
        return self._engine.replica_id

    @property
    def clock(self) -> Clock:
        return self._engine.clock

    @property
    def is_leader(self) -> bool:
        """Whether this replica holds the leader lease now, and so claims the ticks of the
        leader-mode jobs (see ``leader``); a backend of one process is its own leader."""
        return self._engine.leadership.leading()

    @property
    def running(self) -> bool:
        return self._engine.running

    @property
    def stop_timeout(self) -> float:
        """Seconds a shutdown lets the runs going on finish unless it is given a timeout;
        may be changed while the scheduler runs (a daemon's reload, say)."""
        return self._engine.stop_timeout

    @stop_timeout.setter
    def stop_timeout(self, value: float) -> None:
        self._engine.stop_timeout = _check_stop_timeout(value)

    def add_job(
        self,
        trigger: Trigger,
        func: Callable[..., Any],
        /,
        *args: Any,
        name: str | None = None,
        tags: Iterable[str] | str = (),
        overlap: OverlapPolicy = "skip",
        timeout: timedelta | float | None = None,
        start_at: datetime | None = None,
        stop_at: datetime | None = None,
        max_runs: int | None = None,
        catch_up: CatchUp = "latest",
        misfire_grace: timedelta | float | None = None,
        leader: bool | None = None,
        **kwargs: Any,
    ) -> Job:
        """Register ``func(*args, **kwargs)`` to run at each tick of ``trigger``.

        Everything is checked here, never at first fire: the trigger, the options and the
        argument list (bound against ``func``'s signature). The name defaults to the
        function's module and qualified name and must be unique in the scheduler; it is the
        job's identity across replicas.
        """
        registry = self._engine.registry
        spec = build_job_spec(
            trigger,
            func,
            args,
            kwargs,
            name=name,
            tags=tags,
            overlap=overlap,
            timeout=timeout,
            start_at=start_at,
            stop_at=stop_at,
            max_runs=max_runs,
            catch_up=catch_up,
            misfire_grace=misfire_grace,
            default_tz=registry.timezone,
            leader=leader,
        )
        registry.add_job(spec)
        return Job(registry, spec.name)

    def job(self, trigger: Trigger, /, *args: Any, **options: Any) -> Callable[[F], F]:
        """Decorator form of :meth:`add_job`; returns the function unchanged."""

        def register(func: F) -> F:
            self.add_job(trigger, func, *args, **options)
            return func

        return register

    def add_listener(self, listener: Listener) -> None:
        """Tell ``listener`` of what happens from now on (any thread, running or not)."""
        self._engine.observer.add(_check_listener(listener))

    def remove_listener(self, listener: Listener) -> None:
        """Stop telling ``listener``; nothing happens if it was not added."""
        self._engine.observer.remove(listener)

    def remove_job(self, name: str) -> None:
        self._engine.registry.remove_job(name)

    def remove_by_tag(self, tag: str) -> list[str]:
        """Remove every job with ``tag``; returns their names."""
        return self._engine.registry.remove_by_tag(tag)

    @property
    def backend(self) -> Backend:
        """The backend the scheduler coordinates through."""
        return self._engine.backend

    def pause_job(self, name: str) -> bool:
        """Pause a job on every replica sharing the backend (see :meth:`Job.pause`)."""
        return self._engine.registry.pause(name)

    def resume_job(self, name: str, *, run_now: bool = False) -> bool:
        """Resume a paused job on every replica (see :meth:`Job.resume`)."""
        return self._engine.registry.resume(name, run_now)

    def watch_cluster(
        self, callback: Callable[[ClusterStatus | None], None], every: float = 5.0
    ) -> Callable[[], None]:
        """Call ``callback`` on the scheduler's loop with the cluster's status, read from the
        shared backend every ``every`` seconds while the scheduler runs (``None`` when the read
        failed): for metrics and health checks that must not read the database per request.
        Returns the function that stops it."""
        if not math.isfinite(every) or every <= 0:
            raise InvalidJobOptionError(
                f"every must be a positive number of seconds, not {every!r}"
            )
        return self._engine.cluster.watch(callback, every)

    def jobs(self) -> list[Job]:
        registry = self._engine.registry
        return [Job(registry, name) for name in registry.names()]

    def get_job(self, name: str) -> Job:
        registry = self._engine.registry
        registry.spec(name)  # JobNotFoundError for an unknown name
        return Job(registry, name)


class AsyncScheduler(_JobsAPI):
    """The scheduler for asyncio services; runs on the caller's event loop.

    ``async with AsyncScheduler() as s: ...`` fits a FastAPI lifespan.
    """

    async def start(self) -> None:
        await self._engine.start()

    async def cluster_status(self) -> ClusterStatus:
        """The cluster as the shared backend sees it: every job's last run and success, what
        runs now, overdue, paused and drifting jobs, the replicas."""
        return await registry_of(self._engine.backend, "cluster_status").cluster_status()

    async def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop taking ticks, let running jobs finish for up to ``timeout`` seconds (default
        ``stop_timeout``), cancel or signal the rest, release every lock. Idempotent.

        ``wait=False`` cuts the runs going on off at once, also those of a shutdown already
        under way that waits for them (a second Ctrl-C, say)."""
        await self._engine.stop(wait, timeout)

    async def wait_idle(self) -> None:
        """Wait until nothing is left to do at the clock's current time: every due tick
        handled, no run active or waiting, every outcome recorded. Meant for tests that drive
        a :class:`~replicron.testing.FakeClock`; wrap it in ``asyncio.timeout`` as needed."""
        await self._engine.wait_idle()

    async def __aenter__(self) -> AsyncScheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()


class Scheduler(_JobsAPI):
    """The scheduler for threaded code: the engine runs on its own background thread."""

    def _init_face(self) -> None:
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._life = threading.Lock()

    def cluster_status(self) -> ClusterStatus:
        """The cluster as the shared backend sees it (see ``AsyncScheduler.cluster_status``);
        blocks for one backend round trip."""
        return blocking(registry_of(self._engine.backend, "cluster_status").cluster_status())

    def start(self) -> None:
        with self._life:
            self._engine.life.check_usable()
            if self._thread is not None:
                raise SchedulerClosedError("a scheduler can be started once")
            loop = asyncio.new_event_loop()
            started = threading.Event()
            failure: list[BaseException] = []
            self._thread = threading.Thread(
                target=self._serve,
                args=(loop, started, failure),
                name=f"replicron-loop-{self.replica_id}",
                daemon=True,
            )
            self._thread.start()
            started.wait()
            if failure:
                self._thread.join()
                raise failure[0]
            self._loop = loop

    def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        started: threading.Event,
        failure: list[BaseException],
    ) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._engine.start())
        except BaseException as exc:
            failure.append(exc)
            loop.close()
            started.set()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop taking ticks, let running jobs finish for up to ``timeout`` seconds (default
        ``stop_timeout``), signal the rest, release every lock. Idempotent; nothing starts
        after it returns.

        ``wait=False`` cuts the runs going on off at once, also those of a shutdown already
        under way on another thread that waits for them."""
        if not wait:
            self._hurry()
        with self._life:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                self._engine.close_unstarted()
                return
            if threading.current_thread() is thread:
                # Called from a listener or async job on the engine's own loop: it cannot wait
                # for itself, so the stop goes ahead in the background.
                task = loop.create_task(self._engine.stop(wait, timeout))
                task.add_done_callback(lambda _: loop.stop())
                return
            if not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(self._engine.stop(wait, timeout), loop)
                future.result()
                loop.call_soon_threadsafe(loop.stop)
            thread.join()

    def _hurry(self) -> None:
        """A shutdown under way (holding ``_life`` on another thread) stops waiting."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed in between
                loop.call_soon_threadsafe(self._engine.stop_waiting)

    def wait_idle(self, timeout: float | None = 10.0) -> None:
        """Block until nothing is left to do at the clock's current time: every due tick
        handled, no run active or waiting, every outcome recorded. Meant for tests that drive
        a :class:`~replicron.testing.FakeClock`; raises ``TimeoutError`` after ``timeout``."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._engine.wait_idle(), loop)
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
