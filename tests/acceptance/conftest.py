"""Fixtures for the acceptance tests: a fresh database, replica processes, polling helpers.

Replicas are real processes (``python -m tests.acceptance.replica``) started from the
repository root; each one's log goes to a file under the test's ``tmp_path`` and is attached
to the report when the test fails. The per-scenario summary lines are printed at the end of
the run (section "acceptance summary") and on the test's captured output.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeVar

import psycopg
import pytest

from tests.acceptance.replica import SCHEMA
from tests.helpers import fresh_database, poll_until, summary_recorder

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]

SUMMARY = pytest.StashKey[list[str]]()
CLUSTER = pytest.StashKey["Cluster"]()


@pytest.fixture
def dsn() -> Iterator[str]:
    """A fresh database for the test, dropped (with its sessions) afterwards."""
    with fresh_database("replicron_acc") as url:
        yield url


@pytest.fixture
def db(dsn: str) -> Iterator[Conn]:
    """The test's own connection to its database, with the acceptance tables created."""
    with psycopg.connect(dsn, autocommit=True, application_name="acceptance test") as conn:
        conn.execute(SCHEMA)
        yield conn


@dataclass
class Replica:
    replica_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    expected_dead: bool = False


class Cluster:
    """The replica processes of one test, and ways to wait on the database."""

    def __init__(self, dsn: str, db: Conn, log_dir: Path) -> None:
        self.dsn, self.db, self.log_dir = dsn, db, log_dir
        self.replicas: dict[str, Replica] = {}

    # ---- processes ---------------------------------------------------------------------

    def start(
        self,
        replica_id: str,
        *,
        job: str,
        every_s: float,
        task_ms: int,
        clock_offset_ms: int = 0,
        heartbeat_interval: float = 0.5,
        stale_after: float = 1.5,
        stop_timeout: float = 5.0,
        seconds: float = 120.0,
        misfire_grace: float | None = None,
    ) -> Replica:
        assert replica_id not in self.replicas
        command = [
            sys.executable, "-m", "tests.acceptance.replica",
            "--dsn", self.dsn,
            "--replica-id", replica_id,
            "--job", job,
            "--every-s", str(every_s),
            "--task-ms", str(task_ms),
            "--clock-offset-ms", str(clock_offset_ms),
            "--seconds", str(seconds),
            "--heartbeat-interval", str(heartbeat_interval),
            "--stale-after", str(stale_after),
            "--stop-timeout", str(stop_timeout),
        ]  # fmt: skip
        if misfire_grace is not None:
            command += ["--misfire-grace", str(misfire_grace)]
        return self.spawn(replica_id, command)

    def spawn(self, replica_id: str, command: list[str]) -> Replica:
        """Start ``command`` from the repository root as one of the test's replicas: its
        log goes to a file of its own, and it is stopped with the others."""
        log_path = self.log_dir / f"{replica_id}.log"
        log_file = log_path.open("wb")
        proc = subprocess.Popen(command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT)
        replica = Replica(replica_id, proc, log_path, log_file)
        self.replicas[replica_id] = replica
        return replica

    def check_alive(self) -> None:
        """Fail at once when a replica exited that should still be running."""
        for replica in self.replicas.values():
            code = replica.proc.poll()
            if code is not None and not replica.expected_dead:
                raise AssertionError(f"replica {replica.replica_id} exited early with {code}")

    def kill(self, replica_id: str) -> None:
        """SIGKILL the replica and reap it."""
        replica = self.replicas[replica_id]
        replica.expected_dead = True
        replica.proc.send_signal(signal.SIGKILL)
        replica.proc.wait(10)

    def stop(
        self, replica_ids: Iterable[str] | None = None, timeout: float = 30.0
    ) -> dict[str, int]:
        """SIGTERM the replicas (all live ones by default) at once; return their exit codes."""
        ids = [
            r.replica_id
            for r in self.replicas.values()
            if (replica_ids is None or r.replica_id in replica_ids) and r.proc.poll() is None
        ]
        for replica_id in ids:
            self.replicas[replica_id].expected_dead = True
            self.replicas[replica_id].proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = {}
        for replica_id in ids:
            proc = self.replicas[replica_id].proc
            codes[replica_id] = proc.wait(max(0.1, deadline - time.monotonic()))
        return codes

    def close(self) -> None:
        for replica in self.replicas.values():
            if replica.proc.poll() is None:
                replica.proc.kill()
            replica.proc.wait(10)
            replica.log_file.close()

    def logs(self) -> str:
        parts = []
        for replica in self.replicas.values():
            replica.log_file.flush()
            text = replica.log_path.read_text(errors="replace")
            parts.append(f"----- {replica.replica_id} (exit {replica.proc.poll()}) -----\n{text}")
        return "\n".join(parts)

    # ---- the database ------------------------------------------------------------------

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.db.execute(query, params).fetchall()

    def now(self) -> datetime:
        """The database clock (the one the replicas stamp runs with)."""
        [(now,)] = self.rows("SELECT clock_timestamp()")
        assert isinstance(now, datetime)
        return now

    def wait_until(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.05
    ) -> T:
        """Poll ``check`` until it returns something other than None/False; fail after
        ``timeout`` seconds or as soon as a replica dies unexpectedly."""
        return poll_until(what, check, timeout, every, before_each=self.check_alive)

    def wait_ready(self, replica_ids: Iterable[str], timeout: float = 20.0) -> dict[str, datetime]:
        """Wait until each replica has started its scheduler; return when (database clock)."""
        ids = sorted(replica_ids)

        def ready() -> dict[str, datetime] | None:
            rows = self.rows(
                "SELECT replica, min(at) FROM acceptance_events"
                " WHERE event = 'ready' AND replica = ANY(%s) GROUP BY replica",
                (ids,),
            )
            return dict(rows) if len(rows) == len(ids) else None

        return self.wait_until(f"replicas {ids} to be ready", ready, timeout)

    def after_shutdown(self) -> dict[str, str]:
        """What each cleanly stopped replica found right after its ``shutdown()`` returned:
        "locks=N sessions=M" of its lock session (both 0 when nothing leaked)."""
        rows = self.rows("SELECT replica, detail FROM acceptance_events WHERE event = 'stopped'")
        return {str(replica): str(detail) for replica, detail in rows}

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
    request.node.stash[CLUSTER] = cluster
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def summary(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a scenario's summary line: printed now (captured) and at the end of the run."""
    return summary_recorder(request.config.stash.setdefault(SUMMARY, []))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    cluster = item.stash.get(CLUSTER, None)
    if cluster is not None and report.when == "call" and report.failed:
        report.sections.append(("replica logs", cluster.logs()))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(SUMMARY, [])
    if lines:
        terminalreporter.section("acceptance summary")
        for line in lines:
            terminalreporter.write_line(line)
