"""The embedded backend's SQLite ledger: one file, shared by the processes of one host.

One row per claimed tick (or manual run) in ``replicron_runs``; the unique
``(job, scheduled_at)`` makes each tick run once, ``run_id`` (``AUTOINCREMENT``: never reused)
is the fencing token. Times are integer microseconds since the Unix epoch, UTC. The
connection runs in autocommit mode; every write is one short ``BEGIN IMMEDIATE`` transaction,
so writers queue on SQLite's lock for at most ``busy_timeout`` and readers are never blocked
(WAL).

Each row records the claimant's pid and, on Linux, the pid's start time, so that the open row
of a process that died (SIGKILL, OOM) can be told from a run still going, also after the pid
was reused (a restarted container gets the same small pids again).
"""

from __future__ import annotations

import functools
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from replicron.errors import StateDirError

from ._micros import MICROSECOND
from .sqlfiles import SqlFiles

__all__ = ["Ledger", "migrations", "now_us", "process_alive", "process_start"]

#: Outcomes of a tick that ran: counted against ``max_runs``.
_RUN_OUTCOMES = frozenset({"succeeded", "failed", "timed_out", "abandoned"})


def _statements(sql: str) -> tuple[str, ...]:
    """The statements of a migration file, one by one (``executescript`` would commit)."""
    statements, current = [], ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if any(line.strip() and not line.strip().startswith("--") for line in current.splitlines()):
        raise RuntimeError(f"an unfinished statement ends a migration: {current!r}")
    return tuple(statements)


@functools.cache
def migrations() -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """(version, name, statements), from ``sql/migrations/NNNN_name.sql``: applied in order,
    each once, under an exclusive transaction. Read on first use, not on import."""
    return tuple(
        (m.version, m.name, _statements(m.sql)) for m in SqlFiles("replicron.backends").migrations()
    )


_CREATE_MIGRATIONS = """CREATE TABLE IF NOT EXISTS replicron_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
)"""


def now_us() -> int:
    return time.time_ns() // 1000


def _proc_stat(pid: int) -> tuple[bytes, int] | None:
    """(state, start time in clock ticks since boot) from Linux's /proc, else None."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        fields = data[data.rindex(b")") + 2 :].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (an opaque number), where the system tells; else None."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def process_alive(pid: int, start: int | None) -> bool:
    """Whether the process that wrote a row (``pid`` started at ``start``) still runs on this
    host. A zombie is dead; a live pid that started at another time is a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and belongs to another user
    stat = _proc_stat(pid)
    if stat is None:  # no /proc here, or the process just went: count it as alive
        return True
    state, started = stat
    if state in (b"Z", b"X"):
        return False
    return start is None or started == start


def _contended(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


class Ledger:
    """A connection to the ledger file; its methods are short transactions."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._phase = "cannot be opened"
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                self._connect(busy_timeout)
                return
            except BaseException as exc:
                self.close()
                if _contended(exc) and time.monotonic() < deadline:
                    # Processes opening a new ledger together: switching it to WAL can fail
                    # at once rather than wait for the busy timeout. Try again.
                    time.sleep(random.uniform(0.005, 0.05))
                    continue
                if isinstance(exc, sqlite3.Error | OSError):
                    problem = exc.strerror if isinstance(exc, OSError) else None
                    problem = problem or str(exc)
                    raise StateDirError(path, f"{self._phase}: {problem}") from exc
                raise

    def _connect(self, busy_timeout: float) -> None:
        self._conn = conn = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # Reads the header first: a file that is no database fails here, before anything is
        # written to it.
        self._phase = "is not a usable SQLite database"
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        self._phase = "cannot be switched to WAL mode"
        [(mode,)] = conn.execute("PRAGMA journal_mode = WAL").fetchall()
        if str(mode).lower() != "wal":
            raise StateDirError(self.path, f"cannot use WAL mode (journal mode stays {mode!r})")
        conn.execute("PRAGMA synchronous = FULL")  # a committed claim survives a power cut
        self._phase = "cannot be migrated"
        self._migrate(conn)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN EXCLUSIVE")
        try:
            conn.execute(_CREATE_MIGRATIONS)
            done = {row[0] for row in conn.execute("SELECT version FROM replicron_migrations")}
            newest = migrations()[-1][0]
            if done and max(done) > newest:
                raise StateDirError(
                    self.path,
                    f"schema version {max(done)} was written by a newer replicron "
                    f"(this one knows up to {newest})",
                )
            for version, name, statements in migrations():
                if version in done:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO replicron_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, now_us()),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; rolled back if the block raises."""
        with self._mutex:
            conn = self._conn
            if conn is None:
                raise sqlite3.ProgrammingError("the embedded backend is not open")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._mutex:
            if self._conn is None:
                raise sqlite3.ProgrammingError("the embedded backend is not open")
            return self._conn.execute(sql, params).fetchall()

    # ---- statements (``conn`` is inside a write transaction) ------------------------------

    @staticmethod
    def insert_tick(
        conn: sqlite3.Connection,
        job: str,
        tick: int,
        manual: bool,
        replica: str,
        pid: int,
        start: int | None,
    ) -> int | None:
        """Insert the tick's row unless anybody has it; its run id if this call did."""
        cursor = conn.execute(
            "INSERT INTO replicron_runs (job, scheduled_at, manual, replica_id, pid, pid_start,"
            " claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (job, scheduled_at) DO NOTHING",
            (job, tick, manual, replica, pid, start, now_us()),
        )
        return cursor.lastrowid if cursor.rowcount == 1 else None

    @staticmethod
    def runs_reached(conn: sqlite3.Connection, job: str, limit: int) -> bool:
        """Whether ``job`` has ``limit`` scheduled runs: claimed ticks not recorded as not
        run (missed, skipped), pruned ones included, manual runs left out."""
        [(count,)] = conn.execute(
            "SELECT count(*) + coalesce((SELECT runs FROM replicron_pruned_runs WHERE job = ?),"
            " 0) FROM (SELECT 1 FROM replicron_runs WHERE job = ? AND manual = 0"
            " AND (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'timed_out',"
            " 'abandoned')) LIMIT ?)",
            (job, job, limit),
        ).fetchall()
        return bool(count >= limit)

    @staticmethod
    def running_elsewhere(conn: sqlite3.Connection, job: str, run_id: int) -> bool:
        """Whether another started, unfinished run of ``job`` may still be going. Those whose
        process is gone are recorded abandoned on the way."""
        rows = conn.execute(
            "SELECT run_id, pid, pid_start, replica_id FROM replicron_runs"
            " WHERE job = ? AND outcome IS NULL AND started_at IS NOT NULL AND run_id <> ?",
            (job, run_id),
        ).fetchall()
        dead = [(rid, pid, replica) for rid, pid, start, replica in rows
                if pid is not None and not process_alive(pid, start)]  # fmt: skip
        Ledger.abandon(conn, dead)
        return len(dead) < len(rows)

    @staticmethod
    def abandon(conn: sqlite3.Connection, dead: Sequence[tuple[int, int, str]]) -> None:
        """Record abandoned the open rows (run id, pid, replica) of processes that died."""
        now = now_us()
        conn.executemany(
            "UPDATE replicron_runs SET outcome = 'abandoned', finished_at = ?, error = ?"
            " WHERE run_id = ? AND outcome IS NULL",
            [(now, f"process {pid} of replica {replica} died with the tick open", rid)
             for rid, pid, replica in dead],
        )  # fmt: skip

    @staticmethod
    def mark_started(conn: sqlite3.Connection, run_id: int) -> None:
        conn.execute(
            "UPDATE replicron_runs SET started_at = ? WHERE run_id = ?", (now_us(), run_id)
        )

    @staticmethod
    def record(
        conn: sqlite3.Connection,
        job: str,
        tick: int,
        outcome: str,
        started: int | None,
        finished: int | None,
        error: str | None,
    ) -> bool:
        cursor = conn.execute(
            "UPDATE replicron_runs SET outcome = ?, started_at = coalesce(?, started_at),"
            " finished_at = ?, error = ? WHERE job = ? AND scheduled_at = ?",
            (outcome, started, now_us() if finished is None else finished, error, job, tick),
        )
        return cursor.rowcount == 1

    @staticmethod
    def insert_finished(
        conn: sqlite3.Connection,
        job: str,
        tick: int,
        outcome: str,
        error: str | None,
        replica: str,
        pid: int,
    ) -> bool:
        now = now_us()
        cursor = conn.execute(
            "INSERT INTO replicron_runs (job, scheduled_at, replica_id, pid, claimed_at,"
            " finished_at, outcome, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (job, scheduled_at) DO NOTHING",
            (job, tick, replica, pid, now, now, outcome, error),
        )
        return cursor.rowcount == 1

    # ---- reads and housekeeping -----------------------------------------------------------

    def last_ticks(self, jobs: Sequence[str]) -> dict[str, int]:
        # One max() a job: each is a single index lookup (GROUP BY over an IN list would
        # walk every row of each job).
        found: dict[str, int] = {}
        with self._mutex:
            if self._conn is None:
                raise sqlite3.ProgrammingError("the embedded backend is not open")
            conn = self._conn
            conn.execute("BEGIN")  # one snapshot for all of them
            try:
                for job in jobs:
                    [(tick,)] = conn.execute(
                        "SELECT max(scheduled_at) FROM replicron_runs WHERE job = ? AND manual = 0",
                        (job,),
                    ).fetchall()
                    if tick is not None:
                        found[job] = tick
            finally:
                conn.rollback()
        return found

    def abandon_dead(self) -> list[tuple[str, int, str]]:
        """Janitor: record abandoned every open row whose process died; (job, tick, replica)
        of each."""
        rows = self.read(
            "SELECT run_id, job, scheduled_at, replica_id, pid, pid_start FROM replicron_runs"
            " WHERE outcome IS NULL AND pid IS NOT NULL"
        )
        dead = [row for row in rows if not process_alive(row[4], row[5])]
        if dead:
            with self.write() as conn:
                self.abandon(conn, [(rid, pid, replica) for rid, _, _, replica, pid, _ in dead])
        return [(job, tick, replica) for _, job, tick, replica, _, _ in dead]

    def prune(self, retention: timedelta, batch: int = 1000) -> int:
        """Delete finished rows claimed longer than ``retention`` ago, keeping each job's
        latest scheduled tick (catch-up reads it after long pauses); at most ``batch`` rows a
        call."""
        cutoff = now_us() - retention // MICROSECOND
        with self.write() as conn:
            pruned = conn.execute(
                "SELECT run_id, job, manual, outcome FROM replicron_runs old"
                " WHERE old.claimed_at < ? AND old.outcome IS NOT NULL"
                "   AND old.scheduled_at < (SELECT max(latest.scheduled_at)"
                "                           FROM replicron_runs latest"
                "                           WHERE latest.job = old.job AND latest.manual = 0)"
                " LIMIT ?",
                (cutoff, batch),
            ).fetchall()
            conn.executemany(
                "DELETE FROM replicron_runs WHERE run_id = ?", [(row[0],) for row in pruned]
            )
            # The scheduled runs pruned go to their job's tally: max_runs counts them.
            runs = Counter(job for _, job, manual, outcome in pruned
                           if not manual and outcome in _RUN_OUTCOMES)  # fmt: skip
            conn.executemany(
                "INSERT INTO replicron_pruned_runs (job, runs) VALUES (?, ?)"
                " ON CONFLICT (job) DO UPDATE SET runs = runs + excluded.runs",
                runs.items(),
            )
            return len(pruned)
