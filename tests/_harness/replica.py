"""One replica process for the tests: a Scheduler on a PostgresBackend (``--dsn``) or an
EmbeddedBackend (``--state-dir``) running ``--job NAME``, or ``--jobs N`` jobs ``job-0`` ..
``job-{N-1}``, each ``every(seconds=--every-s)`` with ``overlap="skip"`` (with
``--fixed-delay``: ``after(seconds=--every-s)``).

Run as ``python -m tests._harness.replica --replica-id r1 --events FILE --dsn DSN ...`` from
the repository root (:class:`tests._harness.replicas.Replicas` does). What it does goes to the
events file (see :mod:`tests._harness.events`); its log to stderr. Each run works for
``--task-ms`` or until it is told to stop (timeout, shutdown, lost lock). Options:

* ``--runs-table``: each run is also written to ``acceptance_runs`` (database clock; see
  :mod:`tests._harness.runs_table`), and ``stopped`` carries ``locks`` and ``sessions``: what
  the lock session left behind right after ``shutdown()`` returned, while the process lives;
* ``--fail-while FILE``: a run fails at once while FILE reads ``fail``;
* ``--metrics``: a ReplicronCollector is served on ``http://127.0.0.1:PORT/metrics`` (a free
  port, given as ``metrics_port`` in ``ready``).

SIGTERM stops the scheduler with ``shutdown(timeout=--stop-timeout)`` and exits 0. A scheduler
that cannot start writes ``failed`` and exits 2; a replicron error is also printed as one
line, ``replica: error: ...``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from replicron import (
    EmbeddedBackend,
    Listener,
    ReplicronError,
    RunEvent,
    Scheduler,
    SystemClock,
    after,
    current_run,
    every,
)
from replicron.backends import Backend
from replicron.postgres import PostgresBackend
from tests._harness.events import EventLog
from tests._harness.runs_table import RunsTable

__all__ = ["OffsetClock", "main", "set_up_replica_process"]

logger = logging.getLogger("replicron.tests")


def set_up_replica_process(replica_id: str) -> threading.Event:
    """Log to stderr with the replica in every line (replicron's own records at DEBUG), and
    return an event that SIGTERM sets: the signal to shut the scheduler down."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {replica_id} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("replicron").setLevel(logging.DEBUG)
    stop = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    return stop


class OffsetClock(SystemClock):
    """The system clock shifted by a fixed offset, as on a host whose clock is skewed.

    ``now()`` adds the offset; the inherited ``sleep_until``/``asleep_until`` compare their
    deadline with this ``now()``, so the deadlines are in the skewed time as well (a replica
    ahead by 300 ms wakes for a tick 300 ms before it is due in real time).
    """

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return super().now() + self.offset

    def __repr__(self) -> str:
        return f"OffsetClock({self.offset!r})"


def make_task(
    events: EventLog, table: RunsTable | None, task_seconds: float, fail_while: Path | None
) -> Callable[[], None]:
    def task() -> None:
        if fail_while is not None and fail_while.read_text().strip() == "fail":
            raise RuntimeError("the flag file says fail")
        ctx = current_run()
        run = {"job": ctx.job_name, "tick": ctx.scheduled_at.isoformat(), "run_id": ctx.run_id}
        row_id = None
        if table is not None:
            row_id = table.run_started(ctx.job_name, ctx.scheduled_at, ctx.run_id)
        events.write("start", **run)
        # Work for task_seconds, or stop early when the run is told to (timeout, shutdown,
        # lost lock): the event is set then.
        cancelled = ctx.cancelled.wait(task_seconds)
        if cancelled:
            logger.warning("run %s of %s saw its cancel event", ctx.run_id, ctx.job_name)
        if table is not None and row_id is not None:
            table.run_finished(row_id, cancelled)
        events.write("finish", **run, cancelled=cancelled)

    return task


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="replica", description=__doc__.splitlines()[0])
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--events", type=Path, required=True, help="the JSON-lines file")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--dsn", help="PostgresBackend on this database")
    where.add_argument("--state-dir", type=Path, help="EmbeddedBackend on this directory")
    jobs = parser.add_mutually_exclusive_group(required=True)
    jobs.add_argument("--job", help="one job of this name")
    jobs.add_argument("--jobs", type=int, help="this many jobs (job-0, job-1, ..)")
    parser.add_argument("--every-s", type=float, default=1.0, help="the jobs' interval")
    parser.add_argument("--fixed-delay", action="store_true", help="after(seconds=--every-s)")
    parser.add_argument("--task-ms", type=int, default=20, help="how long each run works")
    parser.add_argument("--misfire-grace", type=float, default=None, help="the jobs', seconds")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--clock-offset-ms", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=120.0, help="exit after this long")
    parser.add_argument("--stop-timeout", type=float, default=5.0)
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--stale-after", type=float, default=1.5)
    parser.add_argument(
        "--session-pooler",
        action="store_true",
        help="PostgresBackend(session_pooler=True): connected through a session-mode pooler",
    )
    parser.add_argument(
        "--fence-stale-holders", action="store_true", help="PostgresBackend(fence_stale_holders)"
    )
    parser.add_argument(
        "--coordination",
        choices=("advisory", "lease"),
        default="advisory",
        help="PostgresBackend(coordination=...)",
    )
    parser.add_argument("--runs-table", action="store_true", help="runs in acceptance_runs")
    parser.add_argument("--fail-while", type=Path, help="runs fail while this file says fail")
    parser.add_argument("--metrics", action="store_true", help="serve /metrics on a free port")
    parser.add_argument("--cluster-every", type=float, default=0.5, help="the collector's")
    parser.add_argument("--leader", action="store_true", help="Scheduler(leader=True)")
    return parser.parse_args(argv)


def make_backend(args: argparse.Namespace) -> Backend:
    if args.state_dir is not None:
        return EmbeddedBackend(args.state_dir)
    options: dict[str, Any] = {
        "heartbeat_interval": args.heartbeat_interval,
        "stale_after": args.stale_after,
        "coordination": args.coordination,
    }
    if args.fence_stale_holders:
        options["fence_stale_holders"] = True
    if args.session_pooler:
        options["session_pooler"] = True
    return PostgresBackend(args.dsn, **options)


class LeadershipEvents(Listener):
    """Leader mode: ``leader`` events, ``gained`` true or false, as the scheduler tells; and
    ``taken`` events, a tick this replica tried to claim and found claimed (a standby never
    tries a leader-mode tick)."""

    def __init__(self, events: EventLog) -> None:
        self._events = events

    def on_leader_gained(self, replica_id: str) -> None:
        self._events.write("leader", gained=True)

    def on_leader_lost(self, replica_id: str) -> None:
        self._events.write("leader", gained=False)

    def on_taken(self, event: RunEvent) -> None:
        self._events.write("taken", job=event.job, tick=event.scheduled_at.isoformat())


def make_scheduler(
    args: argparse.Namespace, task: Callable[[], None], events: EventLog | None = None
) -> Scheduler:
    options: dict[str, Any] = {}
    if args.leader:
        options["leader"] = True
        if events is not None:
            options["listeners"] = [LeadershipEvents(events)]
    if args.max_workers is not None:
        options["max_workers"] = args.max_workers
    if args.clock_offset_ms:
        options["clock"] = OffsetClock(timedelta(milliseconds=args.clock_offset_ms))
    scheduler = Scheduler(backend=make_backend(args), replica_id=args.replica_id, **options)
    names = [args.job] if args.job is not None else [f"job-{i}" for i in range(args.jobs)]
    for name in names:
        scheduler.add_job(
            after(seconds=args.every_s) if args.fixed_delay else every(seconds=args.every_s),
            task,
            name=name,
            overlap="skip",
            misfire_grace=args.misfire_grace,
        )
    return scheduler


class Metrics:
    """The scheduler's metrics served over HTTP on a free local port."""

    def __init__(self, scheduler: Scheduler, cluster_every: float) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        from replicron.metrics import ReplicronCollector

        self.collector = ReplicronCollector(scheduler, cluster_every=cluster_every)
        registry = CollectorRegistry()
        registry.register(self.collector)
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self.port = self._server.server_port

    def close(self) -> None:
        self.collector.close()
        self._server.shutdown()
        self._thread.join(5)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = set_up_replica_process(args.replica_id)
    events = EventLog(args.events, args.replica_id)
    table = RunsTable(args.dsn, args.replica_id) if args.runs_table else None
    task = make_task(events, table, args.task_ms / 1000, args.fail_while)
    scheduler = make_scheduler(args, task, events)
    metrics = Metrics(scheduler, args.cluster_every) if args.metrics else None
    try:
        scheduler.start()
    except Exception as exc:
        if isinstance(exc, ReplicronError):
            print(f"replica: error: {exc}", file=sys.stderr, flush=True)
        else:
            logger.exception("the scheduler did not start")
        events.write("failed", error=f"{type(exc).__name__}: {exc}")
        if metrics is not None:
            metrics.close()
        return 2
    events.write("ready", **({} if metrics is None else {"metrics_port": metrics.port}))
    logger.info("ready")
    if not stop.wait(args.seconds):
        logger.warning("no SIGTERM within %s s; stopping", args.seconds)
    events.write("stopping")
    scheduler.shutdown(timeout=args.stop_timeout)
    left: dict[str, int] = {}
    if table is not None:
        # Once shutdown() has returned, the replica's lock session must be gone with its
        # locks, while this process still lives (process exit would release them anyway).
        locks, sessions = table.lock_state(f"replicron {args.replica_id}")
        left = {"locks": locks, "sessions": sessions}
        table.close()
    if metrics is not None:
        metrics.close()
    events.write("stopped", **left)
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
