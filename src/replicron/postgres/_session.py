"""The lock session: one dedicated PostgreSQL connection per replica.

Every advisory lock of the replica lives on this connection, and every statement of the
backend goes through it, one at a time. It is opened directly (never from a transaction
pooler, whose statements may land on different server sessions), in autocommit mode, with TCP
keepalives on both ends so that a dead peer is noticed in seconds. A session whose state is
unknown after an error is closed and never reused: its locks are gone with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from replicron.errors import ReplicronError

__all__ = ["BackendUnavailableError", "LockSession", "TransactionPoolerError"]

logger = logging.getLogger("replicron")

#: libpq connection settings: keepalives, and a bound on unacknowledged sends (ms).
KEEPALIVE_PARAMS: Mapping[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
#: The same on the server's side of the socket, so the server drops a dead replica's session
#: (and so its locks) in about 25 s instead of the OS default of hours.
SERVER_SETTINGS = (
    "SET tcp_keepalives_idle = 10",
    "SET tcp_keepalives_interval = 5",
    "SET tcp_keepalives_count = 3",
    "SET statement_timeout = '30s'",
)


class BackendUnavailableError(ReplicronError, ConnectionError):
    """The database could not be reached or the lock session was lost."""


class TransactionPoolerError(ReplicronError, RuntimeError):
    """The lock session is behind a transaction pooler: advisory locks would not hold."""


class LockSession:
    def __init__(
        self,
        conninfo: str,
        *,
        application_name: str,
        connect_timeout: float,
        on_lost: Callable[[], None],
    ) -> None:
        self.conninfo = conninfo
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self._on_lost = on_lost
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._serial = asyncio.Lock()
        self.backend_pid: int | None = None
        self.generation = 0  # bumped on every (re)connect: locks belong to one generation

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def connect(self) -> None:
        async with self._serial:
            await self._connect_locked()

    async def _connect_locked(self) -> None:
        if self.connected:
            return
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo,
                autocommit=True,
                application_name=self.application_name,
                connect_timeout=max(1, int(self.connect_timeout)),
                **KEEPALIVE_PARAMS,
            )
        except psycopg.Error as exc:
            raise BackendUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            for statement in SERVER_SETTINGS:
                await conn.execute(statement)
            pids = []
            for _ in range(3):
                cursor = await conn.execute("SELECT pg_backend_pid()")
                row = await cursor.fetchone()
                assert row is not None
                pids.append(row[0])
        except psycopg.Error as exc:
            await conn.close()
            raise BackendUnavailableError(f"cannot set up the lock session: {exc}") from exc
        if len(set(pids)) != 1:
            await conn.close()
            raise TransactionPoolerError(
                f"the server process changed between statements ({pids}): the connection goes "
                "through a transaction pooler, where session advisory locks do not hold. "
                "Connect replicron directly to PostgreSQL (or through a session pooler)."
            )
        self._conn, self.backend_pid = conn, pids[0]
        self.generation += 1

    async def fetch(self, query: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run one statement on the session and return its rows.

        Connects first if needed. On a connection error the session is closed for good (its
        locks died with it), ``on_lost`` is called, and :class:`BackendUnavailableError`
        is raised.
        """
        async with self._serial:
            await self._connect_locked()
            conn = self._conn
            assert conn is not None
            try:
                cursor = await conn.execute(query.encode(), params)
                return await cursor.fetchall() if cursor.description else []
            except psycopg.OperationalError as exc:
                await self._drop()
                raise BackendUnavailableError(f"lost the lock session: {exc}") from exc

    async def fetch_many(
        self, statements: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[list[tuple[Any, ...]]]:
        return [await self.fetch(query, params) for query, params in statements]

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # the connection is broken anyway
                logger.debug("closing a broken lock session failed", exc_info=True)
        self._on_lost()

    async def close(self) -> None:
        async with self._serial:
            conn, self._conn = self._conn, None
            if conn is not None and not conn.closed:
                with contextlib.suppress(psycopg.Error):  # closing releases them too
                    await conn.execute("SELECT pg_advisory_unlock_all()")
                await conn.close()
