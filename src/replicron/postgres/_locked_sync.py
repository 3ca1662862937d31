"""Generated from _locked_async.py by tools/async_to_sync.py: do not edit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from replicron.dsn import plain_postgres_url
from replicron.keys import job_lock_key

from ._locked_async import LockedRun, ProcessHolds
from ._secrets import masking_errors

__all__ = ["LockedRun", "locked_run"]

logger = logging.getLogger(__name__)

ConnectionSource = str | psycopg.Connection[Any] | psycopg_pool.ConnectionPool[Any]


_holds = ProcessHolds()


@contextmanager
def _dedicated(source: ConnectionSource) -> Iterator[psycopg.Connection[Any]]:
    """One connection for the whole call: the unlock must run on the session that locked."""
    if isinstance(source, str):
        dsn = plain_postgres_url(source)
        with masking_errors(dsn):  # a bad or refused DSN: its password is not shown
            conn = psycopg.Connection.connect(dsn, autocommit=True)
        with conn:
            yield conn
    elif isinstance(source, psycopg_pool.ConnectionPool):
        with source.connection() as conn:
            yield conn
    elif isinstance(source, psycopg.Connection):
        yield source
    else:
        raise TypeError(f"expected a DSN, a connection or a connection pool, not {source!r}")


def _ask(conn: psycopg.Connection[Any], query: str, key: int) -> bool:
    """One lock function's answer, leaving the connection as it was: a connection that was
    idle outside autocommit gets the transaction its statement opened committed (a session
    lock outlives it), while a transaction of the caller's is left open as found."""
    opened = not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    cursor = conn.execute(query, [key])
    row = cursor.fetchone()
    if opened:
        conn.commit()
    return bool(row and row[0])


def _try_lock(conn: psycopg.Connection[Any], key: int) -> bool:
    if not _holds.take(conn, key):  # a caller sharing this connection holds it
        return False
    try:
        locked = _ask(conn, "SELECT pg_try_advisory_lock(%s::bigint)", key)
    except BaseException:
        _holds.give_back(conn, key)
        raise
    if not locked:
        _holds.give_back(conn, key)
    return locked


def _unlock(conn: psycopg.Connection[Any], name: str, key: int) -> bool:
    try:
        released = _ask(conn, "SELECT pg_advisory_unlock(%s::bigint)", key)
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


def locked_run(
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
    with _dedicated(source) as conn:
        if not _try_lock(conn, key):
            return LockedRun(False)
        try:
            value = func(*args, **kwargs)
        finally:
            _unlock(conn, name, key)
    return LockedRun(True, value)
