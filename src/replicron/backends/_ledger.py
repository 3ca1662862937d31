"""The embedded backend's SQLite ledger: one file, shared by the processes of one host.

One row per claimed tick (or manual run) in ``replicron_runs``; the unique
``(job, scheduled_at)`` makes each tick run once, ``run_id`` (``AUTOINCREMENT``: never reused)
is the fencing token. Times are integer microseconds since the Unix epoch, UTC. The
connection runs in autocommit mode; every write is one short ``BEGIN IMMEDIATE`` transaction,
so writers queue on SQLite's lock for at most ``busy_timeout`` and readers are never blocked
(WAL). Each row records its claimant's process (see :mod:`._processes`). The statements are
the named queries of ``sql/queries.sql``.
"""

from __future__ import annotations

import functools
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

from replicron.errors import StateDirError
from replicron.events import Outcome

from ._micros import MICROSECOND
from ._processes import Claimant, process_alive
from ._sql import migration_files, sql
from ._state_dir import DISK_FULL, out_of_space, problem_of
from .base import RUN_REQUEST_EXPIRY

__all__ = ["Ledger", "OpenRun", "migrations", "now_us"]


class OpenRun(NamedTuple):
    """A row with no outcome yet, and the process that claimed it."""

    run_id: int
    job: str
    tick: int
    replica: str
    pid: int | None
    pid_start: int | None

    def dead(self) -> bool:
        """Its claimant's process is known, and gone."""
        return self.pid is not None and not process_alive(self.pid, self.pid_start)


def _statements(text: str) -> tuple[str, ...]:
    """The statements of a migration file, one by one (``executescript`` would commit)."""
    statements, current = [], ""
    for line in text.splitlines(keepends=True):
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
    return tuple((m.version, m.name, _statements(m.sql)) for m in migration_files())


def now_us() -> int:
    return time.time_ns() // 1000


def _contended(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


def _remove_if_empty(path: Path) -> None:
    """A ledger this start created and could not write a byte to (a full disk): no empty
    file is left behind. Only then: a process creating the ledger at the same moment gets
    the same full disk, whereas on contention it may be writing the file just made."""
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


class Ledger:
    """A connection to the ledger file; its methods are short transactions."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._phase = "cannot be opened"
        deadline = time.monotonic() + busy_timeout
        fresh = not path.exists()
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
                if isinstance(exc, sqlite3.Error | OSError) and out_of_space(exc, path.parent):
                    if fresh:
                        _remove_if_empty(path)
                    raise StateDirError(path, f"cannot be written: {DISK_FULL}") from exc
                if isinstance(exc, sqlite3.Error | OSError):
                    problem = problem_of(exc, path.parent)
                    raise StateDirError(path, f"{self._phase}: {problem}") from exc
                raise

    def _connect(self, busy_timeout: float) -> None:
        # ``timeout`` is SQLite's busy timeout: how long a statement waits for another
        # connection's lock.
        self._conn = conn = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._phase = "is not a usable SQLite database"
        conn.execute(sql("probe")).fetchall()
        self._phase = "cannot be switched to WAL mode"
        [(mode,)] = conn.execute(sql("wal_mode")).fetchall()
        if str(mode).lower() != "wal":
            raise StateDirError(self.path, f"cannot use WAL mode (journal mode stays {mode!r})")
        conn.execute(sql("synchronous_full"))
        conn.execute(sql("wal_checkpoint_pages"))
        conn.execute(sql("wal_size_limit"))
        self._phase = "cannot be migrated"
        self._migrate()
        self._phase = "cannot be opened"
        conn.execute(sql("ran_outcomes_create"))
        conn.executemany(
            sql("ran_outcome_insert"), [{"outcome": o.value} for o in Outcome if o.ran]
        )

    def _migrate(self) -> None:
        with self._transaction(sql("begin_exclusive"), commit=True) as conn:
            conn.execute(sql("migrations_create"))
            done = {version for (version,) in conn.execute(sql("migrations_applied"))}
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
                    sql("migration_record"), {"version": version, "name": name, "now": now_us()}
                )

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction; rolled back if the block raises."""
        return self._transaction(sql("begin_write"), commit=True)

    def snapshot(self) -> AbstractContextManager[sqlite3.Connection]:
        """Reads that see one state of the ledger, and write nothing."""
        return self._transaction(sql("begin_read"), commit=False)

    @contextmanager
    def _transaction(self, begin: str, commit: bool) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            conn = self._conn
            if conn is None:
                raise sqlite3.ProgrammingError("the embedded backend is not open")
            conn.execute(begin)
            try:
                yield conn
                if commit:
                    conn.execute(sql("commit"))
            finally:
                if conn.in_transaction:
                    conn.rollback()

    # ---- statements (``conn`` is inside a write transaction) ------------------------------

    @staticmethod
    def insert_tick(
        conn: sqlite3.Connection, job: str, tick: int, manual: bool, claimant: Claimant
    ) -> int | None:
        """Insert the tick's row unless anybody has it; its run id if this call did."""
        cursor = conn.execute(
            sql("claim_insert"),
            {"job": job, "tick": tick, "manual": manual, **claimant._asdict(), "now": now_us()},
        )
        return cursor.lastrowid if cursor.rowcount == 1 else None

    @staticmethod
    def runs_reached(conn: sqlite3.Connection, job: str, limit: int) -> bool:
        """Whether ``job`` has ``limit`` scheduled runs: claimed ticks not recorded as not
        run (missed, skipped), pruned ones included, manual runs left out."""
        [(count,)] = conn.execute(sql("runs_reached"), {"job": job, "limit": limit}).fetchall()
        return bool(count >= limit)

    @staticmethod
    def last_run(conn: sqlite3.Connection, job: str) -> int | None:
        """The latest tick (microseconds) of ``job``'s scheduled runs, as
        :meth:`runs_reached` counts them; None without any."""
        [(tick,)] = conn.execute(sql("last_run"), {"job": job}).fetchall()
        return None if tick is None else int(tick)

    @staticmethod
    def running_elsewhere(
        conn: sqlite3.Connection, job: str, run_id: int, ended: Collection[int] = ()
    ) -> bool:
        """Whether another started, unfinished run of ``job`` may still be going, apart from
        the runs ``ended`` (known to have ended while their rows wait for their outcome).
        Those whose process is gone are recorded abandoned on the way."""
        params = {"job": job, "run_id": run_id}
        runs = [
            run
            for run in map(OpenRun._make, conn.execute(sql("started_runs_of_job"), params))
            if run.run_id not in ended
        ]
        dead = [run for run in runs if run.dead()]
        Ledger.abandon(conn, dead)
        return len(dead) < len(runs)

    @staticmethod
    def abandon(conn: sqlite3.Connection, dead: Sequence[OpenRun]) -> None:
        """Record abandoned the open rows of processes that died."""
        now = now_us()
        conn.executemany(
            sql("abandon_run"),
            [
                {
                    "outcome": Outcome.ABANDONED.value,
                    "now": now,
                    "run_id": run.run_id,
                    "error": f"process {run.pid} of replica {run.replica} died with the tick open",
                }
                for run in dead
            ],
        )

    @staticmethod
    def abandon_ticks(
        conn: sqlite3.Connection, ticks: Sequence[tuple[str, int]], error: str
    ) -> None:
        """Record abandoned the ticks (job, tick) a replica claimed, where still open."""
        now = now_us()
        conn.executemany(
            sql("abandon_tick"),
            [
                {
                    "outcome": Outcome.ABANDONED.value,
                    "now": now,
                    "error": error,
                    "job": job,
                    "tick": tick,
                }
                for job, tick in ticks
            ],
        )

    @staticmethod
    def start_alone(
        conn: sqlite3.Connection, job: str, run_id: int, ended: Collection[int] = ()
    ) -> bool:
        """Mark the run started, unless another run of ``job`` (but those ``ended``) may
        still be going (the caller holds the job's lock); whether it did."""
        if Ledger.running_elsewhere(conn, job, run_id, ended):
            return False
        conn.execute(sql("mark_started"), {"now": now_us(), "run_id": run_id})
        return True

    @staticmethod
    def record(
        conn: sqlite3.Connection,
        job: str,
        tick: int,
        outcome: Outcome,
        started: int | None,
        finished: int | None,
        error: str | None,
    ) -> bool:
        cursor = conn.execute(
            sql("record_outcome"),
            {
                "outcome": outcome.value,
                "started": started,
                "error": error,
                "job": job,
                "finished": now_us() if finished is None else finished,
                "tick": tick,
            },
        )
        return cursor.rowcount == 1

    @staticmethod
    def insert_finished(
        conn: sqlite3.Connection,
        job: str,
        tick: int,
        outcome: Outcome,
        error: str | None,
        claimant: Claimant,
    ) -> bool:
        cursor = conn.execute(
            sql("insert_finished"),
            {
                "job": job,
                "tick": tick,
                "replica": claimant.replica,
                "pid": claimant.pid,
                "now": now_us(),
                "outcome": outcome.value,
                "error": error,
            },
        )
        return cursor.rowcount == 1

    @staticmethod
    def insert_missed_range(
        conn: sqlite3.Connection,
        job: str,
        span: tuple[int, int, int],
        starts: Sequence[int],
        error: str | None,
        claimant: Claimant,
    ) -> int | None:
        """Record missed the ticks of ``span`` = (first, last, how many) that have no row of
        their own, in one row keyed by the first of ``starts`` with no row, unless another
        range lies in that span or every start has a row; how many ticks the row stands
        for, or None if none was written."""
        first, last, ticks = span
        bounds = {"job": job, "tick": first, "through": last}
        if conn.execute(sql("range_within"), bounds).fetchone() is not None:
            return None
        for start in starts:
            if conn.execute(sql("row_at"), {"job": job, "tick": start}).fetchone() is None:
                break
        else:
            return None  # every start has a row: where the range would begin is unknown
        [(held,)] = conn.execute(sql("ticks_held_within"), bounds).fetchall()
        cursor = conn.execute(
            sql("insert_missed_range"),
            {
                "job": job,
                "tick": start,
                "through": last,
                "ticks": ticks - held,
                "now": now_us(),
                "replica": claimant.replica,
                "pid": claimant.pid,
                "error": error,
            },
        )
        return ticks - held if cursor.rowcount == 1 else None

    # ---- reads and housekeeping -----------------------------------------------------------

    def last_ticks(self, jobs: Sequence[str]) -> dict[str, int]:
        """Each job's latest tick; for a job with none that a replica registered, the instant
        just before the first tick a registration of it expects, so that a catch-up finds
        that tick too (it fell due while every replica that scheduled the job was down)."""
        # One max() a job: each is a single index lookup (GROUP BY over an IN list would
        # walk every row of each job).
        found: dict[str, int] = {}
        with self.snapshot() as conn:
            for job in jobs:
                [(tick,)] = conn.execute(sql("last_tick"), {"job": job}).fetchall()
                if tick is not None:
                    found[job] = tick
                    continue
                firsts = [
                    int(expected.split(",", 1)[0])
                    for (expected,) in conn.execute(sql("expected_of_job"), {"job": job})
                ]
                if firsts:
                    found[job] = min(firsts) - 1
        return found

    def last_finishes(self, jobs: Sequence[str]) -> dict[str, tuple[int, int | None, str | None]]:
        """Each job's latest tick, its finish and outcome (both NULL while open)."""
        found: dict[str, tuple[int, int | None, str | None]] = {}
        with self.snapshot() as conn:
            for job in jobs:
                for tick, finished, outcome in conn.execute(sql("last_finish"), {"job": job}):
                    found[job] = (tick, finished, outcome)
        return found

    def abandon_dead(self) -> list[OpenRun]:
        """Janitor: record abandoned every open row whose process died; those rows."""
        with self.snapshot() as conn:
            runs = [OpenRun._make(row) for row in conn.execute(sql("open_runs_with_pid"))]
        dead = [run for run in runs if run.dead()]
        if dead:
            with self.write() as conn:
                self.abandon(conn, dead)
        return dead

    def prune(self, retention: timedelta, batch: int = 1000) -> int:
        """Delete finished rows claimed longer than ``retention`` ago, keeping each job's
        latest scheduled tick (catch-up reads it after long pauses); at most ``batch`` rows a
        call."""
        now = now_us()
        cutoffs = {
            "cutoff": now - retention // MICROSECOND,
            "requests_cutoff": now - RUN_REQUEST_EXPIRY // MICROSECOND,
            "batch": batch,
        }
        with self.write() as conn:
            pruned = [_Pruned._make(row) for row in conn.execute(sql("prunable_runs"), cutoffs)]
            conn.executemany(sql("delete_run"), [{"run_id": row.run_id} for row in pruned])
            # The scheduled runs pruned go to their job's tally: max_runs counts them.
            runs = Counter(row.job for row in pruned if not row.manual and Outcome(row.outcome).ran)
            conn.executemany(
                sql("tally_pruned_runs"), [{"job": job, "runs": n} for job, n in runs.items()]
            )
            return len(pruned)


class _Pruned(NamedTuple):
    run_id: int
    job: str
    manual: int
    outcome: str
