"""The session of lease mode: a connection that holds no state of replicron's.

Lease mode locks nothing on the server session: every statement is its own transaction and
names, in its parameters, everything it needs (the claimant, the claim token, the epoch). So
the connection may go through a transaction pooler (each statement may land on another server
session), and losing it loses nothing: the next statement opens a new one, and the runs this
replica holds go on under their leases, which only a heartbeat that got through renews.

Nothing set on a server session stays with this replica, so the server's bounds on a statement
(``statement_timeout``, ``lock_timeout``) go in the statement's own transaction: a statement
this replica gave up on (one waiting behind a table lock, say) ends on the server by the same
deadline, wherever the pooler ran it; closing the client's socket would not end that wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ._bounds import bounded_rows
from ._session import (
    BackendUnavailableError,
    LockSession,
    _CannotConnect,
    _close_quietly,
    _RolledBack,
)

__all__ = ["BorrowedSession", "PooledSession"]


class PooledSession(LockSession):
    """One statement at a time on a connection made from the conninfo, with the lock session's
    deadlines and keepalives, but no probe for a pooler and nothing set on the server session
    (a pooler would hand that setting to another client): each statement carries its own."""

    async def _connect_locked(self) -> None:
        if self._invalid:
            await self._drop()
        if self.connected:
            return
        until = self._connect_until()
        conn = await self._open_connection("cannot connect to PostgreSQL", until)
        await self._connected_to(conn, until)
        self._conn, self.backend_pid, self._invalid = conn, None, False
        self.generation += 1

    def _statement(
        self, conn: psycopg.AsyncConnection[Any], query: str, params: Mapping[str, Any]
    ) -> Awaitable[list[tuple[Any, ...]]]:
        return bounded_rows(conn, query, params, self.statement_deadline)

    async def close(self) -> None:
        async with self._serial:
            conn, self._conn = self._conn, None
            if conn is not None:
                await _close_quietly(conn)
        for orphan in list(self._orphans):
            orphan.cancel()
        if self._orphans:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._orphans), timeout=1.0)


class BorrowedSession(PooledSession):
    """Lease mode on the application's own ``psycopg_pool.AsyncConnectionPool``: each statement
    borrows a connection for its own transaction and gives it back; the replica keeps none."""

    def __init__(self, pool: AsyncConnectionPool[Any], **options: Any) -> None:
        super().__init__(pool.conninfo if isinstance(pool.conninfo, str) else "", **options)
        self._pool = pool
        self._began = 0.0, 0.0

    def _sending(self) -> tuple[float, float]:
        # The statement's transaction began at BEGIN, one round trip before the statement was
        # sent: its now(), and so its leases, count from then.
        return self._began

    @property
    def connected(self) -> bool:
        return not self._pool.closed and not self._invalid

    async def _connect_locked(self) -> None:
        self._invalid = False

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._serial:
            try:
                borrowing = self._pool.connection(timeout=self.connect_timeout)
                conn = await borrowing.__aenter__()
            except (psycopg.Error, PoolTimeout) as exc:
                self.connect_failed_at = time.monotonic()
                raise _CannotConnect(f"no connection from the pool: {exc}") from exc
            self.connect_failed_at = None
            failure: BaseException | None = None
            in_statement = False
            self._began = time.time(), time.monotonic()
            try:
                async with conn.transaction():
                    in_statement = True
                    yield conn
                    in_statement = False
            except TimeoutError as exc:
                failure = exc
                raise BackendUnavailableError(f"the pool's connection gave {exc}") from exc
            except psycopg.errors.TransactionRollback as exc:
                failure = exc
                if in_statement:
                    raise
                raise _RolledBack(f"the server rolled the transaction back: {exc}") from exc
            except psycopg.Error as exc:
                # BEGIN and COMMIT are the transaction's own statements, outside the statement's
                # error handling: a connection lost there is the backend's to retry or requeue.
                failure = exc
                if in_statement and not conn.broken:
                    raise  # the server refused the statement: the transaction rolled back
                raise BackendUnavailableError(f"lost the pool's connection: {exc}") from exc
            except BaseException as exc:
                failure = exc
                raise
            finally:
                await borrowing.__aexit__(None if failure is None else type(failure), failure, None)

    async def close(self) -> None:
        for orphan in list(self._orphans):
            orphan.cancel()
        if self._orphans:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._orphans), timeout=1.0)
