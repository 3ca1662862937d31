"""Fixtures for the acceptance tests: a fresh database, replica processes, polling helpers.

Replicas are real processes (:mod:`tests._harness.replica`) started from the repository root;
each one's log goes to a file under the test's ``tmp_path`` and is attached to the report when
the test fails. On PostgreSQL each run is recorded in ``acceptance_runs``, stamped with the
database clock (:mod:`tests._harness.runs_table`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests._harness.daemons import Daemons, daemons_of_test
from tests._harness.processes import Child
from tests._harness.replicas import Replicas
from tests._harness.reporting import report_on_failure
from tests._harness.runs_table import SCHEMA
from tests.helpers import fresh_database

Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def dsn() -> Iterator[str]:
    """A fresh database for the test, dropped (with its sessions) afterwards."""
    with fresh_database("replicron_acc") as url:
        yield url


@pytest.fixture
def db(dsn: str) -> Iterator[Conn]:
    """The test's own connection to its database, with the acceptance table created."""
    with psycopg.connect(dsn, autocommit=True, application_name="acceptance test") as conn:
        conn.execute(SCHEMA)
        yield conn


class Cluster(Replicas):
    """The replica processes of one test on its PostgreSQL database, and ways to wait on
    the database."""

    def __init__(self, dsn: str, db: Conn, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.dsn, self.db = dsn, db

    # ---- processes ---------------------------------------------------------------------

    def start(
        self, replica_id: str, *, job: str, runs_table: bool = True, **options: object
    ) -> Child:
        """Start a replica running ``job`` (see :mod:`tests._harness.replica` for the
        options: ``every_s``, ``task_ms``, ``clock_offset_ms``, ...), its runs written to
        ``acceptance_runs`` unless ``runs_table`` is false."""
        options = {"dsn": self.dsn, "job": job, "runs_table": runs_table, **options}
        return self.spawn_replica(replica_id, options)

    def wait_ready(self, replica_ids: Iterable[str], timeout: float = 20.0) -> dict[str, datetime]:
        """Wait until each replica has started its scheduler; return when."""
        ready = self.ready_events(replica_ids, timeout)
        return {r: datetime.fromtimestamp(e["wall"], UTC) for r, e in ready.items()}

    def after_shutdown(self) -> dict[str, str]:
        """What each cleanly stopped replica found right after its ``shutdown()`` returned:
        "locks=N sessions=M" of its lock session (both 0 when nothing leaked)."""
        return {
            e["replica"]: f"locks={e['locks']} sessions={e['sessions']}"
            for e in self.events("stopped")
        }

    # ---- the database ------------------------------------------------------------------

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.db.execute(query, params).fetchall()

    def now(self) -> datetime:
        """The database clock (the one the replicas stamp runs with)."""
        [(now,)] = self.rows("SELECT clock_timestamp()")
        assert isinstance(now, datetime)
        return now

    def lock_session_pid(self, replica_id: str) -> int | None:
        """The server pid of the replica's lock session (application_name "replicron <id>")."""
        rows = self.rows(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (f"replicron {replica_id}",),
        )
        assert len(rows) <= 1, rows
        return int(rows[0][0]) if rows else None

    def advisory_locks(self) -> list[tuple[int, int]]:
        """(pid, key) of every advisory lock held in this database."""
        rows = self.rows(
            "SELECT pid, (classid::bigint << 32) | objid::bigint FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted AND database = ("
            "   SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return [(int(pid), k - (1 << 64) if k >= 1 << 63 else k) for pid, k in rows]


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, dsn: str, db: Conn, tmp_path: Path
) -> Iterator[Cluster]:
    cluster = Cluster(dsn, db, tmp_path)
    report_on_failure(request, "replica logs", cluster.logs)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def daemon_host() -> type[Daemons]:
    """The kind of host the ``daemons`` fixture makes (a module may ask for a subclass)."""
    return Daemons


@pytest.fixture
def daemons(
    request: pytest.FixtureRequest, tmp_path: Path, daemon_host: type[Daemons]
) -> Iterator[Daemons]:
    """Daemon processes of the test, their logs attached to its report if it fails."""
    with daemons_of_test(request, daemon_host(tmp_path)) as host:
        yield host
