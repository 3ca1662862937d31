"""One replica for the embedded-backend acceptance tests: a Scheduler on an EmbeddedBackend
running one job.

Run as ``python -m tests.acceptance.embedded_replica --state-dir DIR --replica-id r1 --job J``
from the repository root. Its stdout is one JSON object per line, flushed at once:

* ``{"event": "ready", "replica": ..., "pid": ..., "at": <epoch seconds>}`` once the scheduler
  runs;
* ``started`` / ``finished``: a run of the job began / returned (``job``, ``tick`` as ISO-8601,
  ``run_id``, ``at``; ``finished`` adds ``cancelled``);
* ``stopped`` after a clean shutdown.

Logs go to stderr. A replicron error at start (a bad state directory) is printed as one line,
``embedded_replica: error: ...``, and the exit status is 2. SIGTERM stops the scheduler with
``shutdown()`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from replicron import EmbeddedBackend, ReplicronError, Scheduler, current_run, every
from tests.acceptance._runner import set_up_replica_process

logger = logging.getLogger("replicron.acceptance")


class Output:
    """JSON lines on stdout, one writer at a time."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps(
            {"event": event, "replica": self.replica, "pid": os.getpid(), "at": time.time()}
            | fields
        )
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def make_task(out: Output, task_seconds: float) -> Callable[[], None]:
    def task() -> None:
        ctx = current_run()
        run = {"job": ctx.job_name, "tick": ctx.scheduled_at.isoformat(), "run_id": ctx.run_id}
        out.emit("started", **run)
        # Work for task_seconds, or stop early when told to (timeout, shutdown).
        cancelled = ctx.cancelled.wait(task_seconds)
        out.emit("finished", cancelled=cancelled, **run)

    return task


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--job", required=True, help="the job's name")
    parser.add_argument("--every-s", type=float, default=1.0, help="the job's interval")
    parser.add_argument("--task-ms", type=int, default=20, help="how long each run works")
    parser.add_argument("--seconds", type=float, default=120.0, help="exit after this long")
    parser.add_argument("--stop-timeout", type=float, default=5.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = set_up_replica_process(args.replica_id)

    out = Output(args.replica_id)
    scheduler = Scheduler(backend=EmbeddedBackend(args.state_dir), replica_id=args.replica_id)
    scheduler.add_job(
        every(seconds=args.every_s),
        make_task(out, args.task_ms / 1000),
        name=args.job,
        overlap="skip",
    )
    try:
        scheduler.start()
    except ReplicronError as exc:
        print(f"embedded_replica: error: {exc}", file=sys.stderr, flush=True)
        return 2
    out.emit("ready")
    if not stop.wait(args.seconds):
        logger.warning("no SIGTERM within %s s; stopping", args.seconds)
    scheduler.shutdown(timeout=args.stop_timeout)
    out.emit("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
