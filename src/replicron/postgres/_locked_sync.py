"""Generated from _locked_async.py by tools/async_to_sync.py: do not edit."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from replicron.keys import job_lock_key
from replicron.postgres._locked_result import LockedRun

__all__ = ["LockedRun", "locked_run"]

logger = logging.getLogger(__name__)

ConnectionSource = str | psycopg.Connection[Any] | psycopg_pool.ConnectionPool[Any]


@contextmanager
def _dedicated(source: ConnectionSource) -> Iterator[psycopg.Connection[Any]]:
    """One connection for the whole call: the unlock must run on the session that locked."""
    if isinstance(source, str):
        with psycopg.Connection.connect(source, autocommit=True) as conn:
            yield conn
    elif isinstance(source, psycopg_pool.ConnectionPool):
        with source.connection() as conn:
            yield conn
    elif isinstance(source, psycopg.Connection):
        yield source
    else:
        raise TypeError(f"expected a DSN, a connection or a connection pool, not {source!r}")


def _try_lock(conn: psycopg.Connection[Any], key: int) -> bool:
    cursor = conn.execute("SELECT pg_try_advisory_lock(%s::bigint)", [key])
    row = cursor.fetchone()
    return bool(row and row[0])


def _unlock(conn: psycopg.Connection[Any], name: str, key: int) -> bool:
    cursor = conn.execute("SELECT pg_advisory_unlock(%s::bigint)", [key])
    row = cursor.fetchone()
    released = bool(row and row[0])
    if not released:
        logger.error(
            "lock of %r (key %s) was not held at unlock: the session was reset or lost",
            name, key, extra={"event": "lock_error", "job": name},
        )  # fmt: skip
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
