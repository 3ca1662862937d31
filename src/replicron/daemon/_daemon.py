"""``replicron run CONFIG``: the daemon. One AsyncScheduler on the config's backend, signals
(SIGTERM/SIGINT stop gracefully, SIGHUP reloads), and the HTTP endpoint when ``http`` is set."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from replicron.backends import Backend, EmbeddedBackend
from replicron.backends.base import SharedCoordination
from replicron.cluster import ClusterStatus
from replicron.dsn import mask_dsn
from replicron.errors import PastInstantError, ReplicronError
from replicron.events import Listener, RunEvent
from replicron.scheduler import AsyncScheduler
from replicron.web import status_app

from ._build import JobProblem, add_job, add_jobs, update_job
from ._http import Response, json_response, serve
from ._notify_config import Alerts
from .config import (
    ConfigError,
    DaemonConfig,
    SchedulerConfig,
    load_config,
    restarted_settings_kept,
)

__all__ = ["Daemon", "load_checked", "make_scheduler", "preview", "validate"]

logger = logging.getLogger("replicron.daemon")

#: Seconds between reads of the cluster's state for readiness and the metrics' cluster gauges.
CLUSTER_EVERY = 5.0
#: /readyz fails once the latest good read of the backend is older than this.
READY_WITHIN = 3 * CLUSTER_EVERY
#: /healthz fails once the event loop has not turned for this long.
LOOP_STALL = 10.0
#: Settings that only a restart applies (a reload says so and keeps the running ones).
_RESTART_ONLY = (
    "timezone",
    "state_dir",
    "database_url",
    "namespace",
    "replica_id",
    "migrate",
    "session_pooler",
    "coordination",
    "leader",
    "max_workers",
    "max_concurrent_jobs",
    "concurrency_mode",
    "http",
    "heartbeat_interval",
    "stale_after",
    "log_format",
)


def make_backend(settings: SchedulerConfig) -> Backend:
    if settings.database_url:
        # the postgres extra, only when asked for
        from replicron.postgres import PostgresBackend, SettingNames

        return PostgresBackend(
            settings.database_url,
            namespace=settings.namespace,
            migrate=settings.migrate,
            session_pooler=settings.session_pooler,
            coordination=settings.coordination,  # type: ignore[arg-type]
            heartbeat_interval=settings.heartbeat_interval.total_seconds(),
            stale_after=None
            if settings.stale_after is None
            else settings.stale_after.total_seconds(),
            setting_names=SettingNames(
                lease='coordination = "lease" in [scheduler] (or REPLICRON_COORDINATION=lease)',
                session_pooler="session_pooler = true in [scheduler] "
                "(or REPLICRON_SESSION_POOLER=true)",
            ),
        )
    return EmbeddedBackend(settings.state_dir or ".replicron")


def make_scheduler(settings: SchedulerConfig, backend: Backend | None) -> AsyncScheduler:
    return AsyncScheduler(
        timezone=settings.timezone,
        backend=backend,
        replica_id=settings.replica_id,
        stop_timeout=settings.stop_timeout.total_seconds(),
        max_workers=settings.max_workers,
        max_concurrent_jobs=settings.max_concurrent_jobs,
        concurrency_mode=settings.concurrency_mode,  # type: ignore[arg-type]
        defer_gc=True,  # the daemon owns its process (DESIGN: opt-in for a library)
        leader=settings.leader,
    )


async def validate(
    config: DaemonConfig, broken_fields: Mapping[str, frozenset[str]] | None = None
) -> list[str]:
    """Every problem of ``config`` the library finds when its jobs are added (triggers, time
    zones, options, programs, imports, arguments), one line each; nothing is started. The
    jobs in ``broken_fields`` are checked as :func:`add_jobs` says."""
    problems, _ = await preview(config, 0, broken_fields)
    return problems


async def load_checked(
    path: str, count: int = 0
) -> tuple[DaemonConfig | None, list[str], dict[str, list[datetime]]]:
    """Read the config at ``path`` and check it whole: the config (``None`` when it has
    problems), every problem (the file's and its jobs'), and with ``count`` each job's next
    fire times."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        problems = list(exc.problems)
        if exc.partial is not None:  # the jobs that parsed, checked as well: all in one go
            problems += await validate(exc.partial, exc.broken_fields)
        return None, problems, {}
    problems, upcoming = await preview(config, count)
    return (None if problems else config), problems, upcoming


async def preview(
    config: DaemonConfig, count: int, broken_fields: Mapping[str, frozenset[str]] | None = None
) -> tuple[list[str], dict[str, list[datetime]]]:
    """:func:`validate`, and each job's next ``count`` fire times as a scheduler plans them."""
    if config.scheduler.database_url:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return [
                f"{config.path}: [scheduler]: database_url needs PostgreSQL support: "
                "pip install 'replicron[postgres]'"
            ], {}
        from replicron.postgres import conninfo_of

        try:
            conninfo_of(config.scheduler.database_url)
        except ReplicronError as exc:
            return [f"{config.path}: [scheduler]: database_url: {mask_dsn(str(exc))}"], {}
    problems = []
    try:
        scheduler = make_scheduler(config.scheduler, None)
    except ReplicronError as exc:  # a time zone it does not know: its jobs are checked too
        problems.append(f"{config.path}: [scheduler]: {exc}")
        scheduler = make_scheduler(SchedulerConfig(leader=config.scheduler.leader), None)
    try:
        try:
            problems += add_jobs(scheduler, config, broken_fields)
        except RecursionError:
            problems.append(f"{config.path}: values nested too deeply")
        if problems or not count:
            return problems, {}
        added = {j.name for j in scheduler.jobs()}
        return [], {
            job.name: scheduler.get_job(job.name).next_runs(count) if job.name in added else []
            for job in config.jobs
        }
    finally:
        await scheduler.shutdown(wait=False)


class Daemon:
    def __init__(self, config: DaemonConfig, early_signals: list[int] | None = None) -> None:
        self.config = config
        self._early_signals = [] if early_signals is None else early_signals
        self.scheduler: AsyncScheduler | None = None
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()
        self._stop_signals = 0
        self._started = False
        self._hurried = False  # a second stop signal: runs are killed, not waited for
        self._hurry: asyncio.Task[None] | None = None
        self._loop_beat = time.monotonic()
        self._read_at: float | None = None  # monotonic time of the latest good cluster read
        self._read_error = "no read yet"
        self._alerts: Alerts | None = None

    async def run(self) -> int:
        settings = self.config.scheduler
        try:
            backend = make_backend(settings)
            scheduler = self.scheduler = make_scheduler(settings, backend)
        except (ReplicronError, ImportError) as exc:
            logger.error("cannot set up the backend: %s", exc, extra={"event": "startup_failed"})
            return 1
        problems = add_jobs(scheduler, self.config)
        if problems:
            for line in problems:
                logger.error("%s", line, extra={"event": "config_invalid"})
            return 2
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop_signalled, signum)
        loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        for early in self._early_signals:  # came while the config was read
            self._stop_signalled(early)
        scheduler.add_listener(_RunLog())
        scheduler.watch_cluster(self._cluster_read, every=CLUSTER_EVERY)
        collector, registry = _metrics(scheduler)
        self._alerts = Alerts(scheduler, settings.namespace, registry)
        self._alerts.apply(self.config.notify, _pings(self.config))
        server = None
        beat = asyncio.ensure_future(self._beat())
        try:
            if settings.http is not None:
                try:
                    server = await self._serve(settings.http, registry)
                except OSError as exc:
                    # The jobs matter more than their dashboard: they run, and the line says
                    # why probes and scrapes find nobody (a liveness probe restarts the pod).
                    logger.error(
                        "cannot serve HTTP on %s:%d (%s): running without /metrics, /healthz, "
                        "/readyz and the status page",
                        *settings.http,
                        exc.strerror or exc,
                        extra={"event": "http_failed"},
                    )
            try:
                await scheduler.start()
            except Exception as exc:  # unreachable, refused, no privileges: one line, no trace
                said = mask_dsn(" ".join(str(exc).split()))
                logger.error("cannot start: %s", said, extra={"event": "startup_failed"})
                return 1
            self._started = True
            where = (settings.database_url and mask_dsn(settings.database_url)) or os.path.abspath(
                settings.state_dir or ".replicron"
            )
            kind = settings.backend_kind
            if settings.database_url:
                kind += f", {settings.coordination} coordination"
            logger.info(
                "started replica %s with %d jobs on %s (%s)",
                scheduler.replica_id,
                len(self.config.jobs),
                kind,
                where,
                extra={"event": "daemon_started"},
            )
            await self._serve_signals()
            stop_timeout = self.config.scheduler.stop_timeout.total_seconds()
            logger.info(
                "stopping: no new ticks; runs going on get up to %g s to finish (a command "
                "gets SIGTERM its kill_grace before the end, or halfway there if kill_grace is "
                "longer than half of it), then are killed",
                stop_timeout,
                extra={"event": "daemon_stopping"},
            )
            await scheduler.shutdown(wait=not self._hurried, timeout=stop_timeout)
            logger.info("stopped", extra={"event": "daemon_stopped"})
            return 0
        finally:
            beat.cancel()
            if collector is not None:
                collector.close()
            if server is not None:
                server.close()
            await scheduler.shutdown(wait=False)

    def _stop_signalled(self, signum: int) -> None:
        self._stop_signals += 1
        name = signal.Signals(signum).name
        if self._stop_signals == 1:
            logger.info("%s received", name, extra={"event": "signal"})
        elif self.scheduler is not None:
            # Ctrl-C twice, or an impatient supervisor: stop waiting for runs to finish.
            logger.warning(
                "%s received again: killing the runs going on now",
                name,
                extra={"event": "signal"},
            )
            self._hurried = True  # the shutdown to come waits for nothing
            if self._started:  # one that waits may be under way: cut it short
                self._hurry = asyncio.ensure_future(self.scheduler.shutdown(wait=False))
        self._stop.set()

    async def _serve_signals(self) -> None:
        while not self._stop.is_set():
            stop = asyncio.ensure_future(self._stop.wait())
            reload = asyncio.ensure_future(self._reload.wait())
            await asyncio.wait({stop, reload}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            reload.cancel()
            if self._reload.is_set() and not self._stop.is_set():
                self._reload.clear()
                await self.reload()

    async def reload(self) -> bool:
        """Read the config again and apply its jobs; an invalid one is refused whole and the
        running one kept. Returns whether the new config was applied."""
        scheduler = self.scheduler
        assert scheduler is not None
        logger.info("SIGHUP: reloading %s", self.config.path, extra={"event": "reload"})
        new, problems, _ = await load_checked(self.config.path)
        if new is None:
            for line in problems:
                logger.error("%s", line, extra={"event": "reload_rejected"})
            logger.error(
                "reload rejected (%d problems): the running config stays in force",
                len(problems),
                extra={"event": "reload_rejected"},
            )
            return False
        old = self.config
        ignored = [
            k
            for k in _RESTART_ONLY
            if getattr(old.scheduler, k) != getattr(new.scheduler, k)
            # the id the daemon made up at start (host:pid) is no change
            and not (k == "replica_id" and new.scheduler.replica_id is None)
        ]
        if ignored:
            logger.warning(
                "reload: %s changed; these take effect at the next restart",
                ", ".join(ignored),
                extra={"event": "reload_restart_needed"},
            )
        applied = restarted_settings_kept(old, new, _RESTART_ONLY)
        settings = applied.scheduler
        config_dir = os.path.dirname(os.path.abspath(new.path))
        before = {job.name: job for job in old.jobs}
        after = {job.name: job for job in new.jobs}
        added, changed, removed = [], [], []
        running = {j.name for j in scheduler.jobs()}  # not the one-time jobs that are over
        try:
            for name in before.keys() - after.keys():
                if name in running:
                    scheduler.remove_job(name)
                removed.append(name)
            for job in new.jobs:
                if job.name not in before:
                    add_job(scheduler, job, config_dir)
                    added.append(job.name)
                elif job != before[job.name]:
                    if job.name not in running:
                        add_job(scheduler, job, config_dir)
                    else:
                        try:
                            update_job(scheduler, job, config_dir)
                        except PastInstantError:  # a one-time job with nothing left to run
                            scheduler.remove_job(job.name)
                    changed.append(job.name)
        except (JobProblem, ReplicronError) as exc:  # checked above: only a race gets here
            logger.error("reload failed part way: %s", exc, extra={"event": "reload_failed"})
        if self._alerts is not None:
            await self._alerts.reload(new.notify, _pings(new))
        self.config = applied
        scheduler.stop_timeout = settings.stop_timeout.total_seconds()
        logging.getLogger("replicron").setLevel(settings.log_level)
        logger.info(
            "reloaded: %d jobs; added %s, changed %s, removed %s",
            len(new.jobs),
            _names(added),
            _names(changed),
            _names(removed),
            extra={"event": "reloaded"},
        )
        return True

    # ---- health ------------------------------------------------------------------------

    def _cluster_read(self, status: ClusterStatus | None) -> None:
        if status is not None:
            self._read_at = time.monotonic()
        else:
            self._read_error = "the latest read of the cluster's state from the backend failed"

    async def _beat(self) -> None:
        while True:
            self._loop_beat = time.monotonic()
            await asyncio.sleep(1.0)

    async def healthz(self) -> Response:
        scheduler = self.scheduler
        stalled = time.monotonic() - self._loop_beat
        ok = scheduler is not None and scheduler.running and stalled < LOOP_STALL
        body: dict[str, Any] = {
            "status": "ok" if ok else "failing",
            "replica": None if scheduler is None else scheduler.replica_id,
            "scheduler_running": bool(scheduler and scheduler.running),
            "jobs": len(self.config.jobs),
        }
        return json_response(200 if ok else 503, body)

    async def readyz(self) -> Response:
        scheduler = self.scheduler
        problems = []
        if scheduler is None or not scheduler.running:
            problems.append("the scheduler is not running")
        else:
            backend = scheduler.backend
            if isinstance(backend, SharedCoordination) and not backend.connected:
                problems.append("the lock session to PostgreSQL is not open (no lease held)")
            elif isinstance(backend, SharedCoordination) and backend.refusal is not None:
                problems.append(f"claiming nothing: {backend.refusal}")
            age = None if self._read_at is None else time.monotonic() - self._read_at
            if age is None or age > READY_WITHIN:
                since = "never" if age is None else f"{age:.0f} s ago"
                problems.append(
                    f"backend not reachable: last good read {since}; {self._read_error}"
                )
        body = {"status": "ready" if not problems else "not ready", "problems": problems}
        return json_response(200 if not problems else 503, body)

    async def _serve(self, where: tuple[str, int], registry: Any) -> asyncio.AbstractServer:
        assert self.scheduler is not None

        async def metrics() -> Response:
            if registry is None:
                return (
                    503,
                    "text/plain",
                    b"metrics need prometheus-client: pip install 'replicron[metrics]'\n",
                )
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

        endpoints = {"/healthz": self.healthz, "/readyz": self.readyz, "/metrics": metrics}
        page = status_app(self.scheduler, title=f"replicron: {os.path.basename(self.config.path)}")
        server = await serve(where[0], where[1], endpoints, page)
        logger.info(
            "serving /metrics, /healthz, /readyz and the status page on http://%s:%d/",
            where[0],
            where[1],
            extra={"event": "http_listening"},
        )
        return server


class _RunLog(Listener):
    """A line per finished run, as a cron daemon's log has (the engine logs the rest)."""

    def after_success(self, event: RunEvent) -> None:
        took = event.duration
        logger.info(
            "%s[%s] succeeded in %.3f s",
            event.job,
            event.run_id,
            0.0 if took is None else took.total_seconds(),
            extra={"event": "succeeded", "job": event.job, "run_id": event.run_id},
        )


def _metrics(scheduler: AsyncScheduler) -> tuple[Any, Any]:
    try:
        from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

        from replicron.metrics import ReplicronCollector
    except ImportError:
        return None, None
    registry = CollectorRegistry()
    collector = ReplicronCollector(scheduler, cluster_every=CLUSTER_EVERY)
    registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return collector, registry


def _pings(config: DaemonConfig) -> list[tuple[str, str]]:
    return [(job.name, job.ping_url) for job in config.jobs if job.ping_url is not None]


def _names(names: list[str]) -> str:
    return ", ".join(sorted(names)) if names else "none"
