"""Runs recorded in PostgreSQL, stamped with the database clock: ``acceptance_runs``.

A replica started with ``--runs-table`` writes each run's start and end there through a
connection of its own (never its lock session), stamped with ``clock_timestamp()`` so that
runs of different processes compare on one clock, the one the ledger's stamps come from. The
test creates the table (:data:`SCHEMA`) and reads it with SQL.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import psycopg

__all__ = ["SCHEMA", "RunsTable"]

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
"""


class RunsTable:
    """Writes run starts and ends on its own connection (never the lock session)."""

    def __init__(self, dsn: str, replica: str) -> None:
        self.replica = replica
        self._conn = psycopg.connect(dsn, autocommit=True, application_name=f"acceptance {replica}")
        self._lock = threading.Lock()

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
