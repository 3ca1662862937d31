"""The cluster's registry, pauses and status on PostgreSQL, for whoever reads or changes
them: a scheduler, the CLI, a status page. Each call uses a short connection of its own,
never a replica's lock session, so it may come from any thread or event loop, with or
without a running scheduler. Its statements carry the server's bounds in their own
transaction, as those of a lease-mode replica do: one stuck behind a table lock ends on the
server after ``statement_timeout``, through any pooler."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
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

from ._bounds import BOUND_STATEMENT, bounded_rows, server_timeout
from ._secrets import scrub
from ._session import BackendUnavailableError, connect_failure
from ._sql import queries
from ._statements import Statements
from ._status import job_status, replica_status

__all__ = [
    "ClusterCalls",
    "Database",
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
        job,
        replica,
        trigger,
        fingerprint,
        grace,
        tuple(expected),
        last_seen,
        bool(rest[0]) if rest else alive,
    )


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


@dataclasses.dataclass(frozen=True)
class Database:
    """Where the cluster's calls go: a short connection each to ``conninfo``, opened within
    ``connect_timeout``; the server ends each statement after ``statement_timeout``."""

    conninfo: str
    connect_timeout: float
    statement_timeout: float

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of its own, closed after; a statement the server gave up on is
        :class:`BackendUnavailableError`, as a connection that could not be made."""
        async with await self._connect() as conn:
            try:
                yield conn
            except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
                raise BackendUnavailableError(
                    f"PostgreSQL gave no answer within {self.statement_timeout:g} s: {exc}"
                ) from exc

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self.conninfo,
                    autocommit=True,
                    prepare_threshold=None,
                    connect_timeout=max(1, round(self.connect_timeout)),
                    application_name="replicron status",
                ),
                self.connect_timeout,
            )
        except (psycopg.Error, TimeoutError, OSError) as exc:
            scrub(exc, self.conninfo)  # libpq may quote the connection string
            raise BackendUnavailableError(
                connect_failure("cannot connect to PostgreSQL", exc, self.connect_timeout)
            ) from exc

    async def rows(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The rows of the named query, on a connection of its own."""
        async with self.connection() as conn:
            return await bounded_rows(conn, queries()[name], params, self.statement_timeout)


async def read_cluster(db: Database, namespace: str, stale_after: float) -> ClusterStatus:
    """One consistent read of the namespace's ledger, registry, pauses and replicas."""
    q = queries()
    params = {"namespace": namespace, "stale_after": timedelta(seconds=stale_after)}
    async with db.connection() as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        await conn.execute(BOUND_STATEMENT, {"timeout": server_timeout(db.statement_timeout)})
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


async def set_paused(db: Database, namespace: str, job: str, paused: bool, by: str) -> bool:
    """Pause (or resume) ``job``; whether that changed anything."""
    params = {"namespace": namespace, "job": job, "by": by}
    return bool(await db.rows("pause" if paused else "resume", params))


async def request_run(db: Database, namespace: str, job: str, by: str) -> datetime:
    """Ask for a manual run of ``job`` across the namespace; the instant asked for."""
    params = {"namespace": namespace, "job": job, "by": by, "keep": RUN_REQUEST_EXPIRY}
    rows = await db.rows("request_run", params)
    if not rows:
        where = f" in namespace {namespace!r}" if namespace else ""
        raise JobNotFoundError(
            f"no replica has registered a job named {job!r}{where}: nothing could run it"
        )
    at: datetime = rows[0][0]
    return at


async def read_namespaces(db: Database) -> dict[str, int]:
    """Every namespace with recorded runs, and its number of rows."""
    return dict(await db.rows("namespaces", {}))


def _array(ticks: Sequence[datetime]) -> str:
    return "{" + ",".join(tick.astimezone(UTC).isoformat() for tick in ticks) + "}"


async def forget_job(
    db: Database, namespace: str, job: str, stale_after: float
) -> tuple[list[str], list[str]]:
    """Drop the registrations of ``job`` by replicas that are gone: (those dropped, the live
    replicas that still schedule it)."""
    params = {"namespace": namespace, "job": job, "stale_after": timedelta(seconds=stale_after)}
    rows = await db.rows("forget", params)
    return [r for r, gone in rows if gone], [r for r, gone in rows if not gone]


class ClusterCalls:
    """The namespace's registry, pauses and run requests, for a backend: announced and read
    on its ``statements`` (a replica's own, through its session), read and changed by
    everyone else on a short connection to ``database`` each."""

    def __init__(
        self,
        statements: Statements,
        database: Database,
        stale_after: float,
        replica: Callable[[], str],
    ) -> None:
        self._statements = statements
        self._database = database
        self.namespace = statements.namespace
        self.stale_after = stale_after
        self._replica = replica

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Write the jobs this replica schedules (as changed; with ``complete``, all of them)
        to the registry; returns the registrations of its jobs by live replicas that define
        them differently."""
        rows = await self._statements.fetch(
            "announce",
            retry=True,
            replica=self._replica(),
            stale_after=timedelta(seconds=self.stale_after),
            **announce_params(definitions, removed, complete),
        )
        return [registration(row) for row in rows]

    async def cluster_status(self) -> ClusterStatus:
        """The namespace's jobs, pauses and replicas as the database has them (a short
        connection of its own: callable from any event loop, open or not)."""
        return await read_cluster(self._database, self.namespace, self.stale_after)

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` on every replica of the namespace, from each one's next claim;
        False if it was paused already."""
        return await set_paused(self._database, self.namespace, job, True, by)

    async def resume(self, job: str) -> bool:
        """Resume ``job``; False if it was not paused."""
        return await set_paused(self._database, self.namespace, job, False, "")

    async def request_run(self, job: str, by: str) -> datetime:
        """Ask for one manual run of ``job`` across the namespace (see
        :class:`~replicron.backends.base.RunRequests`)."""
        return await request_run(self._database, self.namespace, job, by)

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        """The manual runs asked for ``jobs`` not yet run, oldest first (on the replica's
        session)."""
        rows = await self._statements.fetch(
            "run_requests", retry=True, jobs=list(jobs), keep=RUN_REQUEST_EXPIRY
        )
        return [(job, at) for job, at in rows]

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """A job dropped from the code is expected no more: the registrations of replicas
        that are gone go. Returns their replicas, and the live ones that still schedule it."""
        return await forget_job(self._database, self.namespace, job, self.stale_after)

    async def namespaces(self) -> dict[str, int]:
        """Every namespace with recorded runs in the database, and its number of rows."""
        return await read_namespaces(self._database)
