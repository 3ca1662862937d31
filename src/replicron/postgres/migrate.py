"""Schema migrations: numbered ``.sql`` files applied once each, under an advisory lock,
and recorded in ``replicron_migrations``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from replicron.keys import job_lock_key

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


#: How long a migration waits for another replica's migration before giving up.
LOCK_TIMEOUT = "30s"


async def migrate(conninfo: str) -> list[str]:
    """Apply the pending migrations; returns the names of those applied now."""
    async with await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=None
    ) as conn:
        return await _migrate(conn)


async def migrate_session(session: LockSession) -> list[str]:
    conn = await psycopg.AsyncConnection.connect(
        session.conninfo, autocommit=True, prepare_threshold=None
    )
    async with conn:
        return await _migrate(conn)


async def _migrate(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """Everything in one transaction under a transaction-scoped lock with a lock timeout:
    behind any pooler it stays on one server session, never hangs, and never leaves a lock."""
    applied_now = []
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await conn.execute("SELECT pg_advisory_xact_lock(%s::bigint)", [MIGRATION_LOCK_KEY])
        await conn.execute(_CREATE_TABLE)
        cursor = await conn.execute("SELECT version FROM replicron_migrations")
        done = {row[0] for row in await cursor.fetchall()}
        for migration in migrations():
            if migration.version in done:
                continue
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO replicron_migrations (version, name) VALUES (%s, %s)",
                [migration.version, migration.name],
            )
            applied_now.append(f"{migration.version:04d}_{migration.name}")
    return applied_now
