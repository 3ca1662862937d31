"""The status page scenario's one replica: a Scheduler on an EmbeddedBackend with two jobs.

``nightly-report`` runs once, soon, and fails; ``hourly-sync`` ticks hourly at the minute and
second of ``--tick`` (a moment after the replica has gone), with a grace of ``--grace``
seconds. The replica waits
for the failure, shuts the scheduler down and exits 0, leaving ``hourly-sync``'s tick to
nobody.

Run as ``python -m tests.browser.replica --state-dir DIR --tick ISO --grace S`` from the
repository root. Logs go to stderr.

A scenario of its own rather than options of ``tests/_harness/replica.py``: its jobs (a
failing one-off, a cron job nobody is left to run) and its end (by itself, once the failure is
recorded) are what the page is to show.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from replicron import EmbeddedBackend, Listener, RunEvent, Scheduler, cron, once
from tests._harness.replica import set_up_replica_process

__all__ = ["FAILING", "LATE", "REPLICA", "SECRET", "main"]

FAILING, LATE = "nightly-report", "hourly-sync"
REPLICA = "worker-1"
SECRET = "hunter2-Xy9"


def fail_report() -> None:
    # The kind of error that quotes a URL with its password: the page must mask it.
    raise ConnectionError(
        f"report store unreachable: postgresql://report:{SECRET}@db.internal:5432/reports"
    )


def sync() -> None:
    raise AssertionError("no replica is up at this job's tick: it must not run")


class _Failed(Listener):
    def __init__(self) -> None:
        self.event = threading.Event()

    def after_failure(self, event: RunEvent) -> None:
        if event.job == FAILING:
            self.event.set()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replica")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--tick", type=datetime.fromisoformat, required=True)
    parser.add_argument("--grace", type=float, required=True)
    args = parser.parse_args(argv)
    set_up_replica_process(REPLICA)
    failed = _Failed()
    scheduler = Scheduler(
        backend=EmbeddedBackend(args.state_dir), replica_id=REPLICA, listeners=[failed]
    )
    soon = datetime.now(UTC) + timedelta(milliseconds=300)
    scheduler.add_job(once(soon), fail_report, name=FAILING)
    tick = args.tick.astimezone(UTC)
    hourly = cron(f"{tick.second} {tick.minute} * * * *", seconds=True, tz="UTC")
    scheduler.add_job(hourly, sync, name=LATE, misfire_grace=args.grace)
    scheduler.start()
    try:
        if not failed.event.wait(timeout=30):
            print(f"replica: {FAILING} did not fail within 30 s", file=sys.stderr)
            return 1
    finally:
        scheduler.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
