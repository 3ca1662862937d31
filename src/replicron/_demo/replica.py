"""One replica of ``replicron demo``: a Scheduler on the shared backend, reporting every tick.

Started by the demo's parent as ``python -m replicron._demo.replica --replica ID (--state-dir DIR |
--namespace NS)``; a PostgreSQL URL comes in ``$REPLICRON_DEMO_DATABASE_URL`` (never on the
command line, where ``ps`` would show its password). It runs the demo's jobs and writes one
JSON object per line to its stdout for each tick it saw:

* ``{"kind": "ready", "replica": ..., "at": <epoch seconds>}`` once its scheduler runs;
* ``ran``: it ran the tick (``run_id``, ``late_ms``, ``took_ms``, ``outcome``);
* ``skipped``: another replica had the tick (``on_taken``) or the job's run lock was held
  elsewhere (``on_skipped``);
* ``missed`` / ``error``: ``on_missed`` / ``on_lock_error``.

Everything else (logs, warnings) goes to stderr, which the parent sends to a log file. SIGTERM,
SIGINT or the end of stdin (the parent is gone) stop the scheduler cleanly.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from replicron._schedule.tz import UTC
from replicron.backends.base import Backend
from replicron.backends.embedded import EmbeddedBackend
from replicron.context import current_run
from replicron.dsn import mask_dsn
from replicron.events import Listener, RunEvent
from replicron.scheduler import Scheduler
from replicron.triggers import every

__all__ = ["DATABASE_URL_ENV", "JOBS", "DemoJob", "main"]

DATABASE_URL_ENV = "REPLICRON_DEMO_DATABASE_URL"
STOP_TIMEOUT = 5.0  # seconds a stopping replica lets running tasks finish


class DemoJob:
    """A job of the demo: its name, interval and how long each run works."""

    __slots__ = ("every_s", "name", "work_s")

    def __init__(self, name: str, every_s: int, work_s: float) -> None:
        self.name, self.every_s, self.work_s = name, every_s, work_s


JOBS = (DemoJob("heartbeat", 1, 0.05), DemoJob("report", 3, 0.2))


class Channel:
    """JSON lines to the parent on the process's original stdout; thread-safe.

    Each line is one ``write`` of well under ``PIPE_BUF`` bytes, so lines never interleave.
    A parent that went away stops the replica instead of raising in a hook.
    """

    def __init__(self, fd: int, replica: str, closed: threading.Event) -> None:
        self._fd, self.replica, self._closed = fd, replica, closed
        self._lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        data = json.dumps({"kind": kind, "replica": self.replica, **fields}) + "\n"
        with self._lock:
            if self._closed.is_set():
                return
            try:
                os.write(self._fd, data.encode())
            except OSError:
                self._closed.set()

    def tick(self, kind: str, job: str | None, tick: datetime | str | None, **fields: Any) -> None:
        if job is None or tick is None:
            return
        at = datetime.fromisoformat(tick) if isinstance(tick, str) else tick
        self.send(kind, job=job, tick=at.astimezone(UTC).isoformat(), **fields)


def _ms(delta: timedelta | None) -> float | None:
    return None if delta is None else round(delta.total_seconds() * 1000, 1)


class Reporter(Listener):
    """Turns run events into ``ran``, ``skipped``, ``missed`` and ``error`` lines."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def _ran(self, event: RunEvent) -> None:
        self.channel.tick(
            "ran",
            event.job,
            event.scheduled_at,
            run_id=event.run_id,
            late_ms=_ms(event.lateness),
            took_ms=_ms(event.duration),
            outcome=None if event.outcome is None else event.outcome.value,
        )

    def after_success(self, event: RunEvent) -> None:
        self._ran(event)

    def after_failure(self, event: RunEvent) -> None:
        self._ran(event)

    def on_abandoned(self, event: RunEvent) -> None:
        self._ran(event)

    def on_timeout(self, event: RunEvent) -> None:
        if event.finished_at is not None:  # else the run's end is reported when it returns
            self._ran(event)

    def on_skipped(self, event: RunEvent) -> None:
        why = event.outcome.value if event.outcome is not None else "skipped"
        self.channel.tick("skipped", event.job, event.scheduled_at, why=event.detail or why)

    def on_missed(self, event: RunEvent) -> None:
        self.channel.tick("missed", event.job, event.scheduled_at, why=event.detail or "missed")

    def on_lock_error(self, event: RunEvent) -> None:
        self.channel.tick("error", event.job, event.scheduled_at, why=repr(event.error))

    def on_taken(self, event: RunEvent) -> None:
        self.channel.tick("skipped", event.job, event.scheduled_at, why="another replica has it")


def make_task(work_s: float) -> Callable[[], None]:
    def task() -> None:
        # Work for a while, or stop early when the run is told to (shutdown timeout).
        current_run().cancelled.wait(work_s)

    return task


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="replicron-demo-replica", description="one replica of replicron demo")
    parser.add_argument("--replica", required=True, help="replica id")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--state-dir", type=Path, help="embedded backend state directory")
    where.add_argument("--namespace", help=f"PostgreSQL namespace (URL in ${DATABASE_URL_ENV})")
    return parser.parse_args(argv)


def _backend(args: argparse.Namespace) -> Backend:
    if args.state_dir is not None:
        return EmbeddedBackend(args.state_dir)
    url = os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise RuntimeError(f"${DATABASE_URL_ENV} is not set")
    from replicron.postgres import PostgresBackend

    return PostgresBackend(url, namespace=args.namespace)


def _watch_parent(stop: threading.Event) -> None:
    """Stop when stdin reaches its end: the parent closed it or died."""
    # The raw descriptor, not sys.stdin: a daemon thread blocked inside a buffered reader
    # would hold its lock at interpreter shutdown, and Python aborts then.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    # The channel gets the real stdout; anything else printed goes to stderr (the log file).
    channel_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stop = threading.Event()
    channel = Channel(channel_fd, args.replica, stop)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=_watch_parent, args=(stop,), name="demo-watch", daemon=True).start()

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {args.replica} %(levelname)s %(name)s: %(message)s",
    )

    try:
        scheduler = Scheduler(
            backend=_backend(args), replica_id=args.replica, listeners=[Reporter(channel)]
        )
        for job in JOBS:
            scheduler.add_job(every(seconds=job.every_s), make_task(job.work_s), name=job.name)
        scheduler.start()
    except Exception as exc:  # one line for the parent to quote, never a password
        print(f"cannot start: {mask_dsn(' '.join(str(exc).split()))}", file=sys.stderr)
        return 1
    channel.send("ready", at=time.time())
    stop.wait()
    scheduler.shutdown(timeout=STOP_TIMEOUT)
    logging.getLogger(__name__).info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
