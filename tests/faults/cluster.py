"""The suite's own PostgreSQL cluster, and a test's database on it.

The cluster is the suite's so that faults can be dealt to it freely: it is restarted,
stopped for a while, and has sessions terminated, none of which may happen to the shared
server the other tests use (127.0.0.1:5432). It runs from a temporary directory as the OS
user postgres, with ``fsync=off`` (a crash of the *machine* is not among our faults) and trust
authentication, listening on 127.0.0.1 and on the host side of the replica namespace's link.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from tests.faults.analysis import LEDGER_QUERY, AdvisoryLock, LedgerRow
from tests.faults.workdir import as_postgres, chown_postgres
from tests.helpers import poll_until

__all__ = ["Database", "PgCluster"]

T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]


class PgCluster:
    """A PostgreSQL cluster in ``workdir/data``, run with the binaries in ``bindir``."""

    def __init__(
        self, workdir: Path, bindir: Path, *, port: int, listen: Sequence[str] = ("127.0.0.1",)
    ) -> None:
        self.workdir, self.bindir, self.port = workdir, bindir, port
        self.listen = list(listen)
        self.data = workdir / "data"
        self.log_path = workdir / "postgres.log"

    # ---- life cycle ------------------------------------------------------------------------

    def init(self) -> None:
        """initdb, then this suite's settings and a trust-everyone pg_hba.conf."""
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        settings = {
            "port": str(self.port),
            "listen_addresses": f"'{','.join(self.listen)}'",
            "unix_socket_directories": f"'{self.workdir}'",
            "max_connections": "200",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "64MB",
            "log_line_prefix": "'%m [%p] %d %a '",
            "log_connections": "on",
            "log_disconnections": "on",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# replicron fault-injection suite\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 0.0.0.0/0 trust\nhost all all ::1/128 trust\n"
        )
        chown_postgres(self.data / "pg_hba.conf")

    def start(self) -> None:
        """Start the server and return once it accepts connections."""
        self._pg_ctl("start")

    def stop(self) -> None:
        """Fast shutdown: sessions are ended, clients see the connection close."""
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session ends, the server is back when it returns."""
        self._pg_ctl("restart", "-m", "fast")

    def running(self) -> bool:
        status = subprocess.run(
            as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]),
            capture_output=True,
            check=False,
        )
        return status.returncode == 0

    def ensure_running(self) -> None:
        """Start the server if a test left it stopped (the cluster outlives tests)."""
        if not self.running():
            self.start()

    def close(self) -> None:
        """Stop the server for good (at once: nothing of it is kept)."""
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", "immediate")

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "60", *args)

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            as_postgres([str(self.bindir / program), *args]),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args)} exited {result.returncode}:\n{result.stdout}"
                f"{result.stderr}\n--- postgres log ---\n{self.log_tail()}"
            )

    # ---- databases and sessions --------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", *, host: str = "127.0.0.1") -> str:
        """A DSN for ``dbname`` as the superuser postgres; ``host`` is 127.0.0.1, or the host
        side of the namespace link for a replica inside it."""
        return f"postgresql://postgres@{host}:{self.port}/{dbname}"

    def admin(self) -> Conn:
        return psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10)

    def create_database(self, prefix: str = "faults") -> str:
        """A new empty database; returns its DSN (drop it with :meth:`drop_database`)."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with self.admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, dbname: str) -> None:
        """Drop ``dbname`` and end its sessions (starting the server if it is down)."""
        self.ensure_running()
        with self.admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')

    def terminate_all(self, dbname: str, *, spare: Iterable[int] = ()) -> int:
        """``pg_terminate_backend`` every session of ``dbname`` but the pids in ``spare``;
        waits up to 5 s for each to be gone. Returns how many were terminated."""
        with self.admin() as admin:
            row = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))"
                " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND pid <> ALL(%s)",
                (dbname, list(spare)),
            ).fetchone()
        assert row is not None
        return int(row[0])

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


class Database:
    """A test's own database on the cluster, and the test's view of it.

    The test's connection survives faults: a query that meets a broken connection (server
    restarted, session terminated) reconnects once and retries.
    """

    def __init__(self, cluster: PgCluster, dsn: str) -> None:
        self.cluster = cluster
        self.dsn = dsn
        self.name = dsn.rsplit("/", 1)[1]
        self._conn: Conn | None = None

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        for attempt in (1, 2):
            conn = self.connection()
            try:
                cursor = conn.execute(query, params)
                return cursor.fetchall() if cursor.description else []
            except psycopg.OperationalError:
                self._drop()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def connection(self) -> Conn:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=10, application_name="faults test"
            )
        return self._conn

    def own_pid(self) -> int | None:
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def now(self) -> datetime:
        """The database clock."""
        [(now,)] = self.rows("SELECT clock_timestamp()")
        assert isinstance(now, datetime)
        return now

    def ledger(self) -> list[LedgerRow]:
        return [LedgerRow(*row) for row in self.rows(LEDGER_QUERY)]

    def advisory_locks(self) -> list[AdvisoryLock]:
        """Every advisory lock granted in this database, with its session's name."""
        rows = self.rows(
            "SELECT l.pid, a.application_name, (l.classid::bigint << 32) | l.objid::bigint"
            " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.database = ("
            "   SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return [
            AdvisoryLock(int(pid), app, key - (1 << 64) if key >= 1 << 63 else key)
            for pid, app, key in rows
        ]

    def sessions(self) -> list[tuple[int, str, str | None]]:
        """(pid, application_name, client address) of the other sessions of this database."""
        rows = self.rows(
            "SELECT pid, application_name, host(client_addr) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [(int(pid), str(app), addr) for pid, app, addr in rows]

    def lock_session_pid(self, replica_id: str) -> int | None:
        """The server pid of the replica's lock session (application_name "replicron <id>")."""
        pids = [pid for pid, app, _ in self.sessions() if app == f"replicron {replica_id}"]
        assert len(pids) <= 1, pids
        return pids[0] if pids else None

    def terminate_all(self) -> int:
        """Terminate every session of this database but the test's own."""
        own = self.own_pid()
        return self.cluster.terminate_all(self.name, spare=[] if own is None else [own])

    def wait_until(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.05
    ) -> T:
        """Poll ``check`` until it returns something other than None/False; fail after
        ``timeout`` seconds."""
        return poll_until(what, check, timeout, every)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self._drop()
