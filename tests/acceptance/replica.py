"""One replica for the acceptance tests: a Scheduler on a PostgresBackend running one job.

Run as ``python -m tests.acceptance.replica --dsn DSN --replica-id r1 --job every1 ...`` from
the repository root. Each run's start and end are written to ``acceptance_runs`` through a
connection of its own, stamped with the database clock (``clock_timestamp()``) so that runs of
different processes can be compared; life-cycle events go to ``acceptance_events``. Both tables
are created by the test. SIGTERM stops the scheduler with ``shutdown()`` and exits 0; the
``stopped`` event records the advisory locks and sessions its lock session left behind.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import psycopg

from replicron import Scheduler, SystemClock, current_run, every
from replicron.postgres import PostgresBackend
from tests.acceptance._runner import set_up_replica_process

SCHEMA = """
CREATE TABLE IF NOT EXISTS acceptance_runs (
    id           bigserial PRIMARY KEY,
    replica      text        NOT NULL,
    job          text        NOT NULL,
    scheduled_at timestamptz NOT NULL,
    run_id       bigint,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    cancelled    boolean
);
CREATE TABLE IF NOT EXISTS acceptance_events (
    id      bigserial PRIMARY KEY,
    replica text        NOT NULL,
    event   text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail  text
);
"""

logger = logging.getLogger("replicron.acceptance")


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


class Recorder:
    """Writes run starts/ends and events on its own connection (never the lock session)."""

    def __init__(self, dsn: str, replica: str) -> None:
        self.replica = replica
        self._conn = psycopg.connect(dsn, autocommit=True, application_name=f"acceptance {replica}")
        self._lock = threading.Lock()

    def event(self, event: str, detail: str | None = None) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT INTO acceptance_events (replica, event, detail) VALUES (%s, %s, %s)",
                (self.replica, event, detail),
            )

    def run_started(self, job: str, scheduled_at: datetime, run_id: int | None) -> int:
        with self._lock:
            row = self._conn.execute(
                "INSERT INTO acceptance_runs (replica, job, scheduled_at, run_id, started_at)"
                " VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
                (self.replica, job, scheduled_at, run_id),
            ).fetchone()
        assert row is not None
        return int(row[0])

    def run_finished(self, row_id: int, cancelled: bool) -> None:
        with self._lock:
            self._conn.execute(
                "UPDATE acceptance_runs SET finished_at = clock_timestamp(), cancelled = %s"
                " WHERE id = %s",
                (cancelled, row_id),
            )

    def lock_state(self, application_name: str) -> tuple[int, int]:
        """(advisory locks held, sessions open) of the server sessions named so, once no
        session is left or after two seconds (a closed session leaves the server quickly,
        but not at once)."""
        deadline = time.monotonic() + 2.0
        while True:
            with self._lock:
                row = self._conn.execute(
                    "SELECT (SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a"
                    "        ON a.pid = l.pid WHERE l.locktype = 'advisory'"
                    "        AND a.application_name = %(name)s"
                    "        AND a.datname = current_database()),"
                    "       (SELECT count(*) FROM pg_stat_activity"
                    "        WHERE application_name = %(name)s"
                    "        AND datname = current_database())",
                    {"name": application_name},
                ).fetchone()
            assert row is not None
            locks, sessions = int(row[0]), int(row[1])
            if (locks == 0 and sessions == 0) or time.monotonic() > deadline:
                return locks, sessions
            time.sleep(0.02)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def make_task(recorder: Recorder, task_seconds: float) -> Callable[[], None]:
    def task() -> None:
        ctx = current_run()
        row_id = recorder.run_started(ctx.job_name, ctx.scheduled_at, ctx.run_id)
        # Work for task_seconds, or stop early when the run is told to (timeout, shutdown,
        # lost lock): the event is set then.
        cancelled = ctx.cancelled.wait(task_seconds)
        if cancelled:
            logger.warning("run %s of %s saw its cancel event", ctx.run_id, ctx.job_name)
        recorder.run_finished(row_id, cancelled)

    return task


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--job", required=True, help="the job's name")
    parser.add_argument("--every-s", type=float, default=1.0, help="the job's interval")
    parser.add_argument("--task-ms", type=int, default=20, help="how long each run works")
    parser.add_argument("--clock-offset-ms", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=60.0, help="exit after this long")
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--stale-after", type=float, default=1.5)
    parser.add_argument("--stop-timeout", type=float, default=5.0)
    parser.add_argument("--misfire-grace", type=float, default=None, help="the job's, seconds")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = set_up_replica_process(args.replica_id)

    recorder = Recorder(args.dsn, args.replica_id)
    backend = PostgresBackend(
        args.dsn, heartbeat_interval=args.heartbeat_interval, stale_after=args.stale_after
    )
    scheduler = Scheduler(
        backend=backend,
        replica_id=args.replica_id,
        clock=OffsetClock(timedelta(milliseconds=args.clock_offset_ms)),
    )
    scheduler.add_job(
        every(seconds=args.every_s),
        make_task(recorder, args.task_ms / 1000),
        name=args.job,
        overlap="skip",
        misfire_grace=args.misfire_grace,
    )
    scheduler.start()
    recorder.event("ready")
    logger.info("ready")
    if not stop.wait(args.seconds):
        logger.warning("no SIGTERM within %s s; stopping", args.seconds)
    recorder.event("stopping")
    scheduler.shutdown(timeout=args.stop_timeout)
    # Once shutdown() has returned, the replica's lock session must be gone with its locks,
    # while this process still lives (process exit would release them anyway).
    locks, sessions = recorder.lock_state(f"replicron {args.replica_id}")
    recorder.event("stopped", f"locks={locks} sessions={sessions}")
    recorder.close()
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
