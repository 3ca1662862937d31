"""The cluster's registry, pauses and status in the embedded backend's ledger (see
:mod:`replicron.cluster`). A replica is alive while its process is (pid and start time);
the replicas share the host's clock, so none has an offset."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from replicron.cluster import (
    ClusterStatus,
    JobDefinition,
    JobStatus,
    Pause,
    Registration,
    ReplicaStatus,
    build_status,
)
from replicron.errors import StateDirError

from ._ledger import Ledger, now_us, process_alive
from ._micros import MICROSECOND, from_micros, to_micros
from ._state_dir import LEDGER_NAME

__all__ = [
    "ClusterMethods",
    "announce",
    "forget",
    "paused_jobs",
    "prune_registry",
    "read_cluster",
    "register_replica",
    "replica_stopped",
    "set_paused",
]

#: Misses are counted over the last day.
_DAY_US = 86_400_000_000
_T = TypeVar("_T")


def register_replica(conn: sqlite3.Connection, replica: str, pid: int, start: int | None) -> None:
    now = now_us()
    conn.execute(
        "INSERT INTO replicron_replicas (replica_id, pid, pid_start, started_at, last_seen)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (replica_id) DO UPDATE SET pid = excluded.pid,"
        " pid_start = excluded.pid_start, started_at = excluded.started_at,"
        " last_seen = excluded.last_seen, stopped_at = NULL",
        (replica, pid, start, now, now),
    )


def prune_registry(conn: sqlite3.Connection, retention: timedelta) -> None:
    """Registrations not written for ``retention``, and replicas not seen for as long."""
    cutoff = now_us() - retention // MICROSECOND
    conn.execute("DELETE FROM replicron_jobs WHERE last_seen < ?", (cutoff,))
    conn.execute("DELETE FROM replicron_replicas WHERE last_seen < ?", (cutoff,))


def replica_stopped(conn: sqlite3.Connection, replica: str) -> None:
    conn.execute(
        "UPDATE replicron_replicas SET stopped_at = ? WHERE replica_id = ?", (now_us(), replica)
    )


def paused_jobs(conn: sqlite3.Connection) -> frozenset[str]:
    return frozenset(job for (job,) in conn.execute("SELECT job FROM replicron_paused"))


def announce(
    conn: sqlite3.Connection,
    replica: str,
    definitions: Sequence[JobDefinition],
    removed: Sequence[str],
    complete: bool,
) -> list[Registration]:
    """Write this replica's changed definitions (with ``complete``, all of them: its other
    rows go); the live registrations of its jobs that differ from its own (drift)."""
    now = now_us()
    if complete:
        conn.execute("DELETE FROM replicron_jobs WHERE replica_id = ?", (replica,))
    conn.executemany(
        "INSERT INTO replicron_jobs (job, replica_id, trigger, fingerprint, grace, expected,"
        " last_seen) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job, replica_id) DO UPDATE SET"
        " trigger = excluded.trigger, fingerprint = excluded.fingerprint,"
        " grace = excluded.grace, expected = excluded.expected, last_seen = excluded.last_seen",
        [
            (d.job, replica, d.trigger, d.fingerprint, d.grace // MICROSECOND,
             ",".join(str(to_micros(tick)) for tick in d.expected), now)
            for d in definitions
        ],
    )  # fmt: skip
    conn.executemany(
        "DELETE FROM replicron_jobs WHERE job = ? AND replica_id = ?",
        [(job, replica) for job in removed],
    )
    conn.execute("UPDATE replicron_replicas SET last_seen = ? WHERE replica_id = ?", (now, replica))
    rows = conn.execute(
        "SELECT other.job, other.replica_id, other.trigger, other.fingerprint, other.grace,"
        " other.expected, other.last_seen, seen.pid, seen.pid_start"
        " FROM replicron_jobs mine JOIN replicron_jobs other ON other.job = mine.job"
        "  AND other.replica_id <> mine.replica_id AND other.fingerprint <> mine.fingerprint"
        " JOIN replicron_replicas seen ON seen.replica_id = other.replica_id"
        "  AND seen.stopped_at IS NULL"
        " WHERE mine.replica_id = ? ORDER BY other.job, other.replica_id",
        (replica,),
    ).fetchall()
    return [_registration(row[:7], True) for row in rows if process_alive(row[7], row[8])]


def forget(ledger: Ledger, job: str) -> tuple[list[str], list[str]]:
    """Drop the registrations of ``job`` by replicas that are gone: (those dropped, the live
    replicas that still schedule it)."""
    with ledger.write() as conn:
        rows = conn.execute(
            "SELECT job.replica_id, seen.pid, seen.pid_start, seen.stopped_at"
            " FROM replicron_jobs job"
            " LEFT JOIN replicron_replicas seen ON seen.replica_id = job.replica_id"
            " WHERE job.job = ? ORDER BY job.replica_id",
            (job,),
        ).fetchall()
        live = [r for r, pid, start, stopped in rows
                if pid is not None and stopped is None and process_alive(pid, start)]  # fmt: skip
        gone = [r for r, *_ in rows if r not in live]
        conn.executemany(
            "DELETE FROM replicron_jobs WHERE job = ? AND replica_id = ?",
            [(job, r) for r in gone],
        )
    return gone, live


def set_paused(ledger: Ledger, job: str, paused: bool, by: str) -> bool:
    with ledger.write() as conn:
        if paused:
            cursor = conn.execute(
                "INSERT INTO replicron_paused (job, paused_at, paused_by) VALUES (?, ?, ?)"
                " ON CONFLICT (job) DO NOTHING",
                (job, now_us(), by),
            )
        else:
            cursor = conn.execute("DELETE FROM replicron_paused WHERE job = ?", (job,))
        return cursor.rowcount == 1


def read_cluster(ledger: Ledger) -> ClusterStatus:
    """One consistent read of the ledger, registry, pauses and replicas."""
    with ledger.write() as conn:  # one snapshot; short, and it writes nothing
        now = now_us()
        replicas = {
            replica: (pid, start, started, seen, stopped)
            for replica, pid, start, started, seen, stopped in conn.execute(
                "SELECT replica_id, pid, pid_start, started_at, last_seen, stopped_at"
                " FROM replicron_replicas"
            )
        }
        alive = {
            r: stopped is None and process_alive(pid, start)
            for r, (pid, start, _, _, stopped) in replicas.items()
        }
        registrations = [
            _registration(row, alive.get(row[1], False))
            for row in conn.execute(
                "SELECT job, replica_id, trigger, fingerprint, grace, expected, last_seen"
                " FROM replicron_jobs ORDER BY job, replica_id"
            )
        ]
        pauses = [
            Pause(job, from_micros(at), by)
            for job, at, by in conn.execute(
                "SELECT job, paused_at, paused_by FROM replicron_paused ORDER BY job"
            )
        ]
        jobs = [job for (job,) in conn.execute("SELECT DISTINCT job FROM replicron_runs")]
        ledger_rows = [_job_status(conn, job) for job in sorted(jobs)]
    return build_status(
        "",
        from_micros(now),
        ledger_rows,
        registrations,
        pauses,
        [
            ReplicaStatus(r, pid, None, from_micros(started), from_micros(seen), alive[r])
            for r, (pid, _, started, seen, _) in sorted(replicas.items())
        ],
    )


def _job_status(conn: sqlite3.Connection, job: str) -> JobStatus:
    last = conn.execute(
        "SELECT replica_id, scheduled_at, started_at, finished_at, outcome, error"
        " FROM replicron_runs WHERE job = ? AND outcome IS NOT NULL"
        " ORDER BY scheduled_at DESC LIMIT 1",
        (job,),
    ).fetchone()
    [(success, missed, last_tick)] = conn.execute(
        "SELECT max(finished_at) FILTER (WHERE outcome = 'succeeded'),"
        " count(*) FILTER (WHERE outcome = 'missed' AND scheduled_at > ?),"
        " max(scheduled_at) FILTER (WHERE manual = 0)"
        " FROM replicron_runs WHERE job = ?",
        (now_us() - _DAY_US, job),
    ).fetchall()
    running = tuple(
        (replica, run_id)
        for replica, run_id, pid, start in conn.execute(
            "SELECT replica_id, run_id, pid, pid_start FROM replicron_runs"
            " WHERE job = ? AND outcome IS NULL AND started_at IS NOT NULL ORDER BY run_id",
            (job,),
        )
        if pid is None or process_alive(pid, start)
    )
    replica, scheduled, started, finished, outcome, error = last or (None,) * 6
    return JobStatus(
        job, replica, _at(scheduled), _at(started), _at(finished), outcome, error, _at(success),
        running, int(missed), (), _at(last_tick),
    )  # fmt: skip


def _at(micros: int | None) -> datetime | None:
    return None if micros is None else from_micros(micros)


def _registration(row: Sequence[object], alive: bool) -> Registration:
    job, replica, trigger, fingerprint, grace, expected, seen = row
    assert isinstance(grace, int)
    assert isinstance(seen, int)
    return Registration(
        str(job), str(replica), str(trigger), str(fingerprint),
        timedelta(microseconds=grace),
        tuple(from_micros(int(tick)) for tick in str(expected).split(",") if tick),
        from_micros(seen), alive,
    )  # fmt: skip


class ClusterMethods:
    """The cluster's registry, pauses and status, as methods of ``EmbeddedBackend``."""

    replica_id: str
    state_dir: Path
    busy_timeout: float

    async def _call(self, work: Callable[..., _T], *args: Any) -> _T:
        raise NotImplementedError  # the backend's: on its own thread, one call at a time

    def _require(self) -> Ledger:
        raise NotImplementedError  # the backend's: its open ledger

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Write the jobs this replica schedules (as changed; with ``complete``, all of them)
        to the registry; returns the registrations of its jobs by live replicas that define
        them differently."""
        return await self._call(self._announce, definitions, removed, complete)

    def _announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        with self._require().write() as conn:
            return announce(conn, self.replica_id, definitions, removed, complete)

    async def cluster_status(self) -> ClusterStatus:
        """The jobs, pauses and replicas of the state directory (a connection of its own:
        callable from any event loop, open or not)."""
        return await asyncio.to_thread(self._with_ledger, read_cluster)

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` for every replica of the state directory, from each one's next
        claim; False if it was paused already."""
        return await asyncio.to_thread(self._with_ledger, set_paused, job, True, by)

    async def resume(self, job: str) -> bool:
        """Resume ``job``; False if it was not paused."""
        return await asyncio.to_thread(self._with_ledger, set_paused, job, False, "")

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """A job dropped from the code is expected no more: the registrations of replicas
        that are gone go. Returns their replicas, and the live ones that still schedule it."""
        return await asyncio.to_thread(self._with_ledger, forget, job)

    def _with_ledger(self, work: Callable[..., _T], *args: Any) -> _T:
        path = self.state_dir / LEDGER_NAME
        if not path.is_file():
            raise StateDirError(self.state_dir, "has no replicron ledger: no replica used it yet")
        ledger = Ledger(path, self.busy_timeout)
        try:
            return work(ledger, *args)
        finally:
            ledger.close()
