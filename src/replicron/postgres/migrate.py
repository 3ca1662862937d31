"""Schema migrations: numbered ``.sql`` files applied once each, under an advisory lock,
and recorded in ``replicron_migrations``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import psycopg

from replicron.keys import job_lock_key

from ._secrets import masking_errors
from ._sources import ConnectionSource, conninfo_of
from ._sql import migrations

if TYPE_CHECKING:
    from ._session import LockSession

__all__ = ["MIGRATION_LOCK_KEY", "migrate", "migrate_session"]

#: Held while migrating, so that replicas starting together apply each migration once.
MIGRATION_LOCK_KEY = job_lock_key("replicron:migrations")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS replicron_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


#: How long a migration waits for another replica's migration before giving up (seconds).
LOCK_TIMEOUT = 30.0


async def migrate(conninfo: ConnectionSource) -> list[str]:
    """Apply the pending migrations; returns the names of those applied now."""
    dsn = conninfo_of(conninfo)
    with masking_errors(dsn):
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None)
    async with conn:
        return await _migrate(conn)


async def migrate_session(session: LockSession) -> list[str]:
    """:func:`migrate` on a backend's lock session: on the session's connection (its
    keepalives and timeouts, no connection of its own), with none of its other statements in
    between. For the migration's transaction the session's statement timeout becomes the lock
    timeout, and its deadline that wait plus one statement's."""
    return await session.run(
        functools.partial(_migrate, statement_timeout=LOCK_TIMEOUT),
        deadline=LOCK_TIMEOUT + session.statement_deadline,
    )


async def _migrate(
    conn: psycopg.AsyncConnection[Any], *, statement_timeout: float | None = None
) -> list[str]:
    """Everything in one transaction under a transaction-scoped lock with a lock timeout:
    behind any pooler it stays on one server session, never hangs, and never leaves a lock.
    ``statement_timeout`` (seconds) replaces the connection's for the transaction."""
    applied_now = []
    # Never prepared (a pool's connection may prepare by default; a migration's several
    # commands cannot be one prepared statement, and a transaction pooler may lose them).
    execute = functools.partial(conn.execute, prepare=False)
    async with conn.transaction():
        await execute(f"SET LOCAL lock_timeout = {_ms(LOCK_TIMEOUT)}")
        if statement_timeout is not None:
            await execute(f"SET LOCAL statement_timeout = {_ms(statement_timeout)}")
        await execute("SELECT pg_advisory_xact_lock(%s::bigint)", [MIGRATION_LOCK_KEY])
        await execute(_CREATE_TABLE)
        cursor = await execute("SELECT version FROM replicron_migrations")
        done = {row[0] for row in await cursor.fetchall()}
        for migration in migrations():
            if migration.version in done:
                continue
            await execute(migration.sql.encode())
            await execute(
                "INSERT INTO replicron_migrations (version, name) VALUES (%s, %s)",
                [migration.version, migration.name],
            )
            applied_now.append(f"{migration.version:04d}_{migration.name}")
    return applied_now


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
