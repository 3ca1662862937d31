"""The cluster's registry, pauses and status in the embedded backend's ledger (see
:mod:`replicron.cluster`). A replica is alive while its process is (pid and start time);
the replicas share the host's clock, so none has an offset."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from replicron.cluster import (
    ClusterStatus,
    JobDefinition,
    JobStatus,
    Pause,
    Registration,
    ReplicaStatus,
    build_status,
)
from replicron.errors import JobNotFoundError, StateDirError
from replicron.events import Outcome

from ._call_thread import OnThread
from ._ledger import Ledger, now_us
from ._micros import MICROSECOND, from_micros, to_micros
from ._processes import Claimant, process_alive
from ._sql import sql
from ._state_dir import LEDGER_NAME
from .base import RUN_REQUEST_EXPIRY

__all__ = [
    "SqliteCluster",
    "announce",
    "forget",
    "join",
    "leave",
    "paused_jobs",
    "prune_registry",
    "read_cluster",
    "register_replica",
    "replica_stopped",
    "request_run",
    "run_requests",
    "set_paused",
]

#: Misses are counted over the last day.
_DAY_US = 86_400_000_000
_T = TypeVar("_T")


class _RegistrationRow(NamedTuple):
    job: str
    replica: str
    trigger: str
    fingerprint: str
    grace: int
    expected: str  # microseconds, comma-separated
    last_seen: int

    def registration(self, alive: bool) -> Registration:
        return Registration(
            self.job,
            self.replica,
            self.trigger,
            self.fingerprint,
            timedelta(microseconds=self.grace),
            tuple(from_micros(int(tick)) for tick in self.expected.split(",") if tick),
            from_micros(self.last_seen),
            alive,
        )


class _ReplicaRow(NamedTuple):
    replica: str
    pid: int
    pid_start: int | None
    started_at: int
    last_seen: int
    stopped_at: int | None


def _alive(pid: int | None, start: int | None, stopped: int | None) -> bool:
    """Whether a replica (its process, unless it stopped) is alive."""
    return pid is not None and stopped is None and process_alive(pid, start)


def register_replica(conn: sqlite3.Connection, claimant: Claimant) -> None:
    conn.execute(sql("replica_register"), {**claimant._asdict(), "now": now_us()})


def prune_registry(conn: sqlite3.Connection, retention: timedelta) -> None:
    """Registrations not written for ``retention``, and replicas not seen for as long."""
    cutoff = {"cutoff": now_us() - retention // MICROSECOND}
    conn.execute(sql("prune_registrations"), cutoff)
    conn.execute(sql("prune_replicas"), cutoff)


def replica_stopped(conn: sqlite3.Connection, replica: str) -> None:
    conn.execute(sql("replica_stopped"), {"now": now_us(), "replica": replica})


def join(conn: sqlite3.Connection, replica: str, since: datetime) -> None:
    """``replica`` plans every tick from ``since`` on (a leaving replica hands it only the
    ticks from then on)."""
    conn.execute(sql("replica_joined"), {"since": to_micros(since), "replica": replica})


def leave(ledger: Ledger, replica: str) -> dict[str, datetime]:
    """``replica`` claims no more: gone for the others at once; then, in a transaction of its
    own (of two replicas leaving at once, at least one sees the other gone), the others whose
    processes are alive and not stopping, with when each joined."""
    with ledger.write() as conn:
        replica_stopped(conn, replica)
    with ledger.write() as conn:
        rows = conn.execute(sql("replicas")).fetchall()
    return {
        other: from_micros(joined)
        for other, pid, start, joined, _, stopped in rows
        if other != replica and _alive(pid, start, stopped)
    }


def paused_jobs(conn: sqlite3.Connection) -> frozenset[str]:
    return frozenset(job for (job,) in conn.execute(sql("paused_jobs")))


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
        conn.execute(sql("registrations_of_replica_delete"), {"replica": replica})
    conn.executemany(
        sql("registration_upsert"),
        [
            {
                "job": d.job,
                "replica": replica,
                "trigger": d.trigger,
                "fingerprint": d.fingerprint,
                "grace": d.grace // MICROSECOND,
                "expected": ",".join(str(to_micros(tick)) for tick in d.expected),
                "now": now,
            }
            for d in definitions
        ],
    )
    conn.executemany(
        sql("registration_delete"), [{"job": job, "replica": replica} for job in removed]
    )
    conn.execute(sql("replica_seen"), {"now": now, "replica": replica})
    return [
        _RegistrationRow(*row).registration(True)
        for *row, pid, start in conn.execute(sql("drifted_registrations"), {"replica": replica})
        if process_alive(pid, start)
    ]


def forget(ledger: Ledger, job: str) -> tuple[list[str], list[str]]:
    """Drop the registrations of ``job`` by replicas that are gone: (those dropped, the live
    replicas that still schedule it)."""
    with ledger.write() as conn:
        rows = conn.execute(sql("registrants_of_job"), {"job": job}).fetchall()
        live = [replica for replica, *process in rows if _alive(*process)]
        gone = [replica for replica, *_ in rows if replica not in live]
        conn.executemany(
            sql("registration_delete"), [{"job": job, "replica": replica} for replica in gone]
        )
    return gone, live


def set_paused(ledger: Ledger, job: str, paused: bool, by: str) -> bool:
    with ledger.write() as conn:
        if paused:
            cursor = conn.execute(sql("pause_insert"), {"job": job, "now": now_us(), "by": by})
        else:
            cursor = conn.execute(sql("pause_delete"), {"job": job})
        return cursor.rowcount == 1


def request_run(ledger: Ledger, job: str, by: str) -> datetime:
    """Ask for a manual run of ``job`` across the replicas; the instant asked for."""
    now = now_us()
    with ledger.write() as conn:
        conn.execute(sql("run_requests_expire"), {"since": now - _expiry_us()})
        cursor = conn.execute(sql("run_request_insert"), {"job": job, "now": now, "by": by})
        if cursor.rowcount != 1:
            raise JobNotFoundError(
                f"no replica has registered a job named {job!r}: nothing could run it"
            )
    return from_micros(now)


def run_requests(ledger: Ledger, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
    wanted = set(jobs)
    with ledger.snapshot() as conn:
        rows = conn.execute(sql("run_requests"), {"since": now_us() - _expiry_us()}).fetchall()
    return [(job, from_micros(at)) for job, at in rows if job in wanted]


def _expiry_us() -> int:
    return RUN_REQUEST_EXPIRY // MICROSECOND


def read_cluster(ledger: Ledger) -> ClusterStatus:
    """One consistent read of the ledger, registry, pauses and replicas."""
    with ledger.write() as conn:  # one snapshot; short, and it writes nothing
        now = now_us()
        replicas = sorted(_ReplicaRow._make(row) for row in conn.execute(sql("replicas")))
        alive = {r.replica: _alive(r.pid, r.pid_start, r.stopped_at) for r in replicas}
        registrations = [
            row.registration(alive.get(row.replica, False))
            for row in map(_RegistrationRow._make, conn.execute(sql("registrations")))
        ]
        pauses = [Pause(job, from_micros(at), by) for job, at, by in conn.execute(sql("pauses"))]
        jobs = [job for (job,) in conn.execute(sql("ledger_jobs"))]
        ledger_rows = [_job_status(conn, job) for job in sorted(jobs)]
        holder = conn.execute(sql("leader_seen")).fetchone()
    status = build_status(
        "",
        from_micros(now),
        ledger_rows,
        registrations,
        pauses,
        [
            ReplicaStatus(
                r.replica,
                r.pid,
                None,
                from_micros(r.started_at),
                from_micros(r.last_seen),
                alive[r.replica],
            )
            for r in replicas
        ],
    )
    # The lease is a lock file: its holder leads while its process lives and has not stopped.
    leader = holder[0] if holder is not None and alive.get(holder[0], False) else None
    return dataclasses.replace(status, leader=leader)


def _job_status(conn: sqlite3.Connection, job: str) -> JobStatus:
    last = conn.execute(sql("last_outcome"), {"job": job}).fetchone()
    [(success, missed, last_tick)] = conn.execute(
        sql("job_tallies"),
        {
            "job": job,
            "since": now_us() - _DAY_US,
            "succeeded": Outcome.SUCCEEDED.value,
            "missed": Outcome.MISSED.value,
        },
    ).fetchall()
    running = tuple(
        (replica, run_id)
        for replica, run_id, pid, start in conn.execute(sql("started_runs"), {"job": job})
        if pid is None or process_alive(pid, start)
    )
    replica, scheduled, started, finished, outcome, error = last or (None,) * 6
    return JobStatus(
        job,
        replica,
        _at(scheduled),
        _at(started),
        _at(finished),
        outcome,
        error,
        _at(success),
        running,
        int(missed),
        (),
        _at(last_tick),
    )


def _at(micros: int | None) -> datetime | None:
    return None if micros is None else from_micros(micros)


class SqliteCluster:
    """The cluster's registry, pauses, run requests and status, for one backend handle.

    What its replica writes or reads as it schedules (``announce``, ``run_requests``) goes
    through ``on_thread`` into the handle's open ``ledger``, as ``replica``. What anyone may
    ask (status, pauses, run requests, forgetting) opens the ledger of ``state_dir`` on a
    connection of its own: callable from any event loop, open or not.
    """

    def __init__(
        self,
        state_dir: Path,
        busy_timeout: float,
        *,
        on_thread: OnThread,
        ledger: Callable[[], Ledger],
        replica: Callable[[], str],
    ) -> None:
        self._state_dir = state_dir
        self._busy_timeout = busy_timeout
        self._on_thread = on_thread
        self._ledger = ledger
        self._replica = replica

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        return await self._on_thread(self._announce, definitions, removed, complete)

    def _announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        with self._ledger().write() as conn:
            return announce(conn, self._replica(), definitions, removed, complete)

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        return await self._on_thread(self._run_requests, jobs)

    def _run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        return run_requests(self._ledger(), jobs)

    async def status(self) -> ClusterStatus:
        return await asyncio.to_thread(self._with_ledger, read_cluster)

    async def pause(self, job: str, by: str) -> bool:
        return await asyncio.to_thread(self._with_ledger, set_paused, job, True, by)

    async def resume(self, job: str) -> bool:
        return await asyncio.to_thread(self._with_ledger, set_paused, job, False, "")

    async def request_run(self, job: str, by: str) -> datetime:
        return await asyncio.to_thread(self._with_ledger, request_run, job, by)

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        return await asyncio.to_thread(self._with_ledger, forget, job)

    def _with_ledger(self, work: Callable[..., _T], *args: Any) -> _T:
        path = self._state_dir / LEDGER_NAME
        if not path.is_file():
            raise StateDirError(self._state_dir, "has no replicron ledger: no replica used it yet")
        ledger = Ledger(path, self._busy_timeout)
        try:
            return work(ledger, *args)
        finally:
            ledger.close()
