"""One replica for the fault-injection tests: a Scheduler on a PostgresBackend with N jobs.

Run as ``python -m tests.faults.replica --dsn DSN --replica-id r1 --events FILE ...`` from the
repository root. The jobs are ``job-0`` .. ``job-{N-1}``, each ``every(seconds=S)`` with
``overlap="skip"``; each run appends a "start" and a "finish" line to the events file.

The replica never writes to the database itself: a partitioned replica could not, and the
test must see what its tasks did regardless. Every line is one JSON object written with one
``write`` to a file opened with ``O_APPEND``, so lines from the task threads never interleave.
Each carries ``mono`` (``time.monotonic()``: one clock for every process of the machine, not
shifted by libfaketime) and ``wall`` (``time.time()``: this process's own idea of the time,
shifted when the replica runs under libfaketime).

SIGTERM stops the scheduler with ``shutdown(timeout=--stop-timeout)``; the process then logs
"stopped" and exits 0. A scheduler that cannot start logs "failed" and exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from replicron import Scheduler, current_run, every
from replicron.postgres import PostgresBackend
from tests.acceptance._runner import set_up_replica_process

logger = logging.getLogger("replicron.faults")


class EventLog:
    """Appends one JSON line per event to a file shared safely by threads (and processes)."""

    def __init__(self, path: Path, replica_id: str) -> None:
        self.replica_id = replica_id
        self.pid = os.getpid()
        # Never closed: a task thread may still write after shutdown() gave up on it, and
        # the process's exit closes it anyway.
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: Any) -> None:
        record = {
            "event": event,
            "replica": self.replica_id,
            "pid": self.pid,
            "mono": time.monotonic(),
            "wall": time.time(),
            **fields,
        }
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        os.write(self._fd, line)  # one write: O_APPEND keeps the line whole


def make_task(events: EventLog, task_seconds: float) -> Callable[[], None]:
    def task() -> None:
        ctx = current_run()
        run = {"job": ctx.job_name, "tick": ctx.scheduled_at.isoformat(), "run_id": ctx.run_id}
        events.write("start", **run)
        # Work for task_seconds, or stop early when told to (shutdown, lost lock): the
        # run's cancel event is set then.
        cancelled = ctx.cancelled.wait(task_seconds)
        events.write("finish", **run, cancelled=cancelled)

    return task


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--events", type=Path, required=True, help="the JSON-lines file")
    parser.add_argument("--jobs", type=int, default=1, help="how many jobs (job-0, job-1, ..)")
    parser.add_argument("--every-s", type=float, default=1.0, help="the jobs' interval")
    parser.add_argument("--task-ms", type=int, default=50, help="how long each run works")
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--stale-after", type=float, default=1.5)
    parser.add_argument("--stop-timeout", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=120.0, help="exit after this long")
    parser.add_argument(
        "--session-pooler",
        action="store_true",
        help="PostgresBackend(session_pooler=True): connected through a session-mode pooler",
    )
    parser.add_argument(
        "--fence-stale-holders",
        action="store_true",
        help="PostgresBackend(fence_stale_holders=True)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = set_up_replica_process(args.replica_id)
    events = EventLog(args.events, args.replica_id)

    options: dict[str, Any] = {
        "heartbeat_interval": args.heartbeat_interval,
        "stale_after": args.stale_after,
    }
    if args.fence_stale_holders:
        options["fence_stale_holders"] = True
    if args.session_pooler:
        options["session_pooler"] = True
    scheduler = Scheduler(
        backend=PostgresBackend(args.dsn, **options),
        replica_id=args.replica_id,
        max_workers=max(8, args.jobs),  # every job's run can start on time
    )
    task = make_task(events, args.task_ms / 1000)
    for i in range(args.jobs):
        scheduler.add_job(every(seconds=args.every_s), task, name=f"job-{i}", overlap="skip")
    try:
        scheduler.start()
    except Exception as exc:
        logger.exception("the scheduler did not start")
        events.write("failed", error=f"{type(exc).__name__}: {exc}")
        return 2
    events.write("ready")
    logger.info("ready")
    if not stop.wait(args.seconds):
        logger.warning("no SIGTERM within %s s; stopping", args.seconds)
    events.write("stopping")
    scheduler.shutdown(timeout=args.stop_timeout)
    events.write("stopped")
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
