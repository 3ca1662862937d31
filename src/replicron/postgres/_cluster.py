"""The cluster's registry, pauses and status on PostgreSQL, for whoever reads or changes
them: a scheduler, the CLI, a status page. Each call uses a short connection of its own,
never a replica's lock session, so it may come from any thread or event loop, with or
without a running scheduler."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from replicron.backends.base import RUN_REQUEST_EXPIRY
from replicron.cluster import (
    ClusterStatus,
    JobDefinition,
    Pause,
    Registration,
    build_status,
)
from replicron.errors import JobNotFoundError

from ._secrets import scrub
from ._session import BackendUnavailableError, connect_failure
from ._sql import queries
from ._status import job_status, replica_status

__all__ = [
    "ClusterMethods",
    "announce_params",
    "forget_job",
    "read_cluster",
    "read_namespaces",
    "registration",
    "request_run",
    "set_paused",
]


def registration(row: tuple[Any, ...], alive: bool = True) -> Registration:
    job, replica, trigger, fingerprint, grace, expected, last_seen, *rest = row
    return Registration(
        job, replica, trigger, fingerprint, grace, tuple(expected), last_seen,
        bool(rest[0]) if rest else alive,
    )  # fmt: skip


def announce_params(
    definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
) -> dict[str, Any]:
    return {
        "complete": complete,
        "jobs": [d.job for d in definitions],
        "triggers": [d.trigger for d in definitions],
        "fingerprints": [d.fingerprint for d in definitions],
        "graces": [d.grace for d in definitions],
        # One array literal per job: psycopg sends a list of lists as one 2-D array.
        "expected": [_array(d.expected) for d in definitions],
        "removed": list(removed),
    }


async def _connect(conninfo: str, connect_timeout: float) -> psycopg.AsyncConnection[Any]:
    try:
        return await asyncio.wait_for(
            psycopg.AsyncConnection.connect(
                conninfo,
                autocommit=True,
                prepare_threshold=None,
                connect_timeout=max(1, round(connect_timeout)),
                application_name="replicron status",
            ),
            connect_timeout,
        )
    except (psycopg.Error, TimeoutError, OSError) as exc:
        scrub(exc, conninfo)  # libpq may quote the connection string
        raise BackendUnavailableError(
            connect_failure("cannot connect to PostgreSQL", exc, connect_timeout)
        ) from exc


async def read_cluster(
    conninfo: str, namespace: str, stale_after: float, connect_timeout: float
) -> ClusterStatus:
    """One consistent read of the namespace's ledger, registry, pauses and replicas."""
    q = queries()
    params = {"namespace": namespace, "stale_after": timedelta(seconds=stale_after)}
    conn = await _connect(conninfo, connect_timeout)
    async with conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        rows = {}
        for name in ("database_clock", "status", "registrations", "pauses", "replicas"):
            cursor = await conn.execute(q[name], params)
            rows[name] = await cursor.fetchall()
        leader = await _leader(conn, q["leader_now"], params)
    [(now,)] = rows["database_clock"]
    status = build_status(
        namespace,
        now,
        [job_status(row) for row in rows["status"]],
        [registration(row) for row in rows["registrations"]],
        [Pause(*row) for row in rows["pauses"]],
        [replica_status(row) for row in rows["replicas"]],
    )
    return dataclasses.replace(status, leader=leader)


async def _leader(conn: psycopg.AsyncConnection[Any], query: str, params: Any) -> str | None:
    """The leader, in the status's transaction; none on a schema without leader mode yet."""
    try:
        async with conn.transaction():  # a savepoint: its error leaves the rest of the read
            cursor = await conn.execute(query, params)
            found = await cursor.fetchall()
    except psycopg.errors.UndefinedTable:
        return None
    return str(found[0][0]) if found else None


async def set_paused(
    conninfo: str, namespace: str, job: str, paused: bool, by: str, connect_timeout: float
) -> bool:
    """Pause (or resume) ``job``; whether that changed anything."""
    query = queries()["pause" if paused else "resume"]
    async with await _connect(conninfo, connect_timeout) as conn:
        cursor = await conn.execute(query, {"namespace": namespace, "job": job, "by": by})
        return bool(await cursor.fetchall())


async def request_run(
    conninfo: str, namespace: str, job: str, by: str, connect_timeout: float
) -> datetime:
    """Ask for a manual run of ``job`` across the namespace; the instant asked for."""
    params = {"namespace": namespace, "job": job, "by": by, "keep": RUN_REQUEST_EXPIRY}
    async with await _connect(conninfo, connect_timeout) as conn:
        cursor = await conn.execute(queries()["request_run"], params)
        row = await cursor.fetchone()
    if row is None:
        where = f" in namespace {namespace!r}" if namespace else ""
        raise JobNotFoundError(
            f"no replica has registered a job named {job!r}{where}: nothing could run it"
        )
    at: datetime = row[0]
    return at


async def read_namespaces(conninfo: str, connect_timeout: float) -> dict[str, int]:
    """Every namespace with recorded runs, and its number of rows."""
    conn = await _connect(conninfo, connect_timeout)
    async with conn:
        cursor = await conn.execute(queries()["namespaces"])
        rows: list[tuple[str, int]] = await cursor.fetchall()
        return dict(rows)


def _array(ticks: Sequence[datetime]) -> str:
    return "{" + ",".join(tick.astimezone(UTC).isoformat() for tick in ticks) + "}"


async def forget_job(
    conninfo: str, namespace: str, job: str, stale_after: float, connect_timeout: float
) -> tuple[list[str], list[str]]:
    """Drop the registrations of ``job`` by replicas that are gone: (those dropped, the live
    replicas that still schedule it)."""
    params = {"namespace": namespace, "job": job, "stale_after": timedelta(seconds=stale_after)}
    conn = await _connect(conninfo, connect_timeout)
    async with conn:
        cursor = await conn.execute(queries()["forget"], params)
        rows: list[tuple[str, bool]] = await cursor.fetchall()
    return [r for r, gone in rows if gone], [r for r, gone in rows if not gone]


class ClusterMethods:
    """The cluster's registry and pauses, as methods of :class:`PostgresBackend`."""

    conninfo: str
    namespace: str
    stale_after: float
    connect_timeout: float
    replica_id: str

    async def _fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        raise NotImplementedError  # the backend's: on its lock session

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Write the jobs this replica schedules (as changed; with ``complete``, all of them)
        to the registry; returns the registrations of its jobs by live replicas that define
        them differently."""
        rows = await self._fetch(
            "announce", retry=True, replica=self.replica_id,
            stale_after=timedelta(seconds=self.stale_after),
            **announce_params(definitions, removed, complete),
        )  # fmt: skip
        return [registration(row) for row in rows]

    async def cluster_status(self) -> ClusterStatus:
        """The namespace's jobs, pauses and replicas as the database has them (a short
        connection of its own: callable from any event loop, open or not)."""
        return await read_cluster(
            self.conninfo, self.namespace, self.stale_after, self.connect_timeout
        )

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` on every replica of the namespace, from each one's next claim;
        False if it was paused already."""
        return await set_paused(self.conninfo, self.namespace, job, True, by, self.connect_timeout)

    async def resume(self, job: str) -> bool:
        """Resume ``job``; False if it was not paused."""
        return await set_paused(self.conninfo, self.namespace, job, False, "", self.connect_timeout)

    async def request_run(self, job: str, by: str) -> datetime:
        """Ask for one manual run of ``job`` across the namespace (see
        :class:`~replicron.backends.base.RunRequests`)."""
        return await request_run(self.conninfo, self.namespace, job, by, self.connect_timeout)

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        """The manual runs asked for ``jobs`` not yet run, oldest first (on the lock
        session)."""
        rows = await self._fetch(
            "run_requests", retry=True, jobs=list(jobs), keep=RUN_REQUEST_EXPIRY
        )
        return [(job, at) for job, at in rows]

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """A job dropped from the code is expected no more: the registrations of replicas
        that are gone go. Returns their replicas, and the live ones that still schedule it."""
        return await forget_job(
            self.conninfo, self.namespace, job, self.stale_after, self.connect_timeout
        )
