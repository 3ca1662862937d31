"""The bounds a connection of the PostgreSQL backend carries: TCP keepalives and
``tcp_user_timeout`` on both ends, and the server's own timeouts on its statements, so that
neither a cut-off replica nor a statement it gave up on stays on the server for long."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import psycopg

__all__ = [
    "BOUND_STATEMENT",
    "bounded_rows",
    "keepalive_params",
    "server_settings",
    "server_timeout",
]


def keepalive_params(drop_after: float) -> dict[str, Any]:
    """libpq settings so that this side gives up on a silent peer within ``drop_after``
    seconds: keepalives while idle, ``tcp_user_timeout`` while data is unacknowledged."""
    idle, interval, count = _keepalive_timing(drop_after)
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": int(drop_after * 1000),
    }


def server_settings(drop_after: float, statement_deadline: float, version: int) -> dict[str, str]:
    """The same bounds on the server's side, so the server drops a cut-off replica's session,
    and so its locks, within about ``drop_after`` seconds: when the socket is idle
    (keepalives) and when it holds an unacknowledged reply (``tcp_user_timeout``, which
    keepalives alone do not bound: retransmissions would go on for about 15 minutes). A peer
    whose kernel still answers (a frozen process, a hung proxy) keeps its session: its runs
    may go on, so its locks hold (see ``fence_stale_holders``). With them the server's own
    ``statement_timeout``: a statement the client gave up on ends on the server as well. And
    no JIT compilation: a claim of a few thousand ticks is estimated costly enough to compile,
    which takes longer than the statement (p50 of a 2,000-tick claim 188 ms with it, 97 ms
    without: bench/pg_claim_latency.py)."""
    idle, interval, count = _keepalive_timing(drop_after)
    settings = {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(count),
        "statement_timeout": server_timeout(statement_deadline),
        "jit": "off",
    }
    if version >= 120000:
        settings["tcp_user_timeout"] = str(int(drop_after * 1000))
    return settings


def server_timeout(deadline: float) -> str:
    """A client deadline (seconds) as the server's ``statement_timeout``/``lock_timeout``."""
    return str(max(1, int(deadline * 1000)))


#: The server's own bounds on the statement sent with it, for their transaction only (a
#: transaction pooler keeps nothing of a session for the next one): past them the server
#: cancels the statement, also while it waits for a lock. Closing the client's socket would
#: not end that wait, nor (behind a pooler) reach the server session at all.
BOUND_STATEMENT = (
    "SELECT set_config('statement_timeout', %(timeout)s, true),"
    " set_config('lock_timeout', %(timeout)s, true)"
)


async def bounded_rows(
    conn: psycopg.AsyncConnection[Any], query: str, params: Mapping[str, Any], deadline: float
) -> list[tuple[Any, ...]]:
    """The rows of ``query``, which the server gives up after ``deadline`` seconds: the bounds
    go in the statement's own transaction, pipelined with it (one round trip). Without
    pipeline support in libpq (before 14), in an explicit transaction."""
    bound = {"timeout": server_timeout(deadline)}
    if not psycopg.AsyncPipeline.is_supported():
        async with conn.transaction():
            await conn.execute(BOUND_STATEMENT.encode(), bound, prepare=False)
            return await _rows(conn, query, params)
    # A failure inside the block is raised after it: leaving a pipeline on a lost connection
    # fails again, and psycopg logs that second failure as a warning of its own.
    failure: psycopg.Error | None = None
    try:
        async with conn.pipeline():  # in autocommit mode, one implicit transaction to its sync
            try:
                await conn.execute(BOUND_STATEMENT.encode(), bound, prepare=False)
                cursor = await conn.execute(query.encode(), params, prepare=False)
            except psycopg.Error as exc:
                failure = exc
    except psycopg.Error:
        if failure is None:
            raise
    if failure is not None:
        raise failure
    return await cursor.fetchall() if cursor.description else []


def _keepalive_timing(drop_after: float) -> tuple[int, int, int]:
    """(idle, interval, count) in whole seconds with idle + interval * count <= drop_after
    (at least 1 s each: the socket options take seconds)."""
    count = 3
    interval = max(1, math.floor(drop_after / 6))
    idle = max(1, math.floor(drop_after - interval * count))
    return idle, interval, count


async def _rows(
    conn: psycopg.AsyncConnection[Any], query: str, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    # Never prepared: on the application's pool (lease mode) the pool's own threshold would
    # prepare them, and behind a transaction pooler a prepared statement may be missing.
    cursor = await conn.execute(query.encode(), params, prepare=False)
    return await cursor.fetchall() if cursor.description else []
