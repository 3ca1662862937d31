"""``alocked_run``: the standalone building block, async flavour (source of the sync one).

``tools/async_to_sync.py`` generates ``_locked_sync.py`` from this file; CI fails when the
two drift. Edit this file, then run the tool. What both flavours share, the result and the
locks this process's callers hold, is defined here alone: the sync flavour imports it.
"""

from __future__ import annotations

import asyncio  # async-only
import inspect  # async-only
import logging
import threading  # async-only
import weakref  # async-only
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple  # sync: from typing import Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from replicron.dsn import plain_postgres_url
from replicron.keys import job_lock_key

# sync: from ._locked_async import LockedRun, ProcessHolds
from ._secrets import masking_errors

__all__ = ["LockedRun", "alocked_run"]

logger = logging.getLogger(__name__)

ConnectionSource = str | psycopg.AsyncConnection[Any] | psycopg_pool.AsyncConnectionPool[Any]


# async-only: from here (both flavours share these: one LockedRun, whichever flavour returns it)
class LockedRun(NamedTuple):
    """Whether the function ran (``False``: another holder had the lock) and its value."""

    ran: bool
    value: Any = None


class ProcessHolds:
    """The lock keys this process's callers hold, per connection. An advisory lock re-enters
    within its session, so callers sharing one connection would all get it: they exclude
    each other here first."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()

    def take(self, conn: Any, key: int) -> bool:
        with self._guard:
            keys = self._held.setdefault(conn, set())
            if key in keys:
                return False
            keys.add(key)
            return True

    def give_back(self, conn: Any, key: int) -> None:
        with self._guard:
            self._held.get(conn, set()).discard(key)


# async-only: to here

_holds = ProcessHolds()


@asynccontextmanager
async def _dedicated(source: ConnectionSource) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """One connection for the whole call: the unlock must run on the session that locked."""
    if isinstance(source, str):
        dsn = plain_postgres_url(source)
        with masking_errors(dsn):  # a bad or refused DSN: its password is not shown
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with conn:
            yield conn
    elif isinstance(source, psycopg_pool.AsyncConnectionPool):
        async with source.connection() as conn:
            yield conn
    elif isinstance(source, psycopg.AsyncConnection):
        yield source
    else:
        raise TypeError(f"expected a DSN, a connection or a connection pool, not {source!r}")


async def _ask(conn: psycopg.AsyncConnection[Any], query: str, key: int) -> bool:
    """One lock function's answer, leaving the connection as it was: a connection that was
    idle outside autocommit gets the transaction its statement opened committed (a session
    lock outlives it), while a transaction of the caller's is left open as found."""
    opened = not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    cursor = await conn.execute(query, [key])
    row = await cursor.fetchone()
    if opened:
        await conn.commit()
    return bool(row and row[0])


async def _try_lock(conn: psycopg.AsyncConnection[Any], key: int) -> bool:
    if not _holds.take(conn, key):  # a caller sharing this connection holds it
        return False
    try:
        locked = await _ask(conn, "SELECT pg_try_advisory_lock(%s::bigint)", key)
    except BaseException:
        _holds.give_back(conn, key)
        raise
    if not locked:
        _holds.give_back(conn, key)
    return locked


async def _unlock(conn: psycopg.AsyncConnection[Any], name: str, key: int) -> bool:
    try:
        released = await _ask(conn, "SELECT pg_advisory_unlock(%s::bigint)", key)
    finally:
        _holds.give_back(conn, key)
    if not released:
        logger.error(
            "lock of %r (key %s) was not held at unlock: the session was reset or lost",
            name,
            key,
            extra={"event": "lock_error", "job": name},
        )
    return released


# async-only: from here (only a task can be cancelled while it waits for the unlock)
async def _unlock_shielded(conn: psycopg.AsyncConnection[Any], name: str, key: int) -> bool:
    """``_unlock`` run to its end even if the caller is cancelled meanwhile: a lock left held
    would outlive the call on a connection that goes back to its pool or its owner. The
    cancellation is re-raised afterwards."""
    unlocking = asyncio.ensure_future(_unlock(conn, name, key))
    try:
        return await asyncio.shield(unlocking)
    except asyncio.CancelledError:
        await unlocking
        raise


# async-only: to here


async def alocked_run(
    source: ConnectionSource,
    name: str,
    func: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> LockedRun:
    """Run ``func(*args, **kwargs)`` only if no one else holds the lock of ``name``.

    The lock is ``pg_try_advisory_lock(job_lock_key(name))`` on one dedicated connection
    (from the DSN, the pool, or the connection given), never waited for. The unlock runs on
    that same connection even when ``func`` raises or the caller is cancelled, and its result
    is checked. Returns ``LockedRun(ran, value)``.

    A connection given may be shared by callers of this process (threads, tasks): they
    exclude each other (an advisory lock would re-enter within the session), and the
    connection is left as found (idle stays idle, a transaction of the caller's stays open).
    """
    key = job_lock_key(name)
    async with _dedicated(source) as conn:
        if not await _try_lock(conn, key):
            return LockedRun(False)
        try:
            value = func(*args, **kwargs)
            if inspect.isawaitable(value):  # async-only
                value = await value  # async-only
        finally:
            await _unlock_shielded(conn, name, key)  # sync: _unlock(conn, name, key)
    return LockedRun(True, value)
