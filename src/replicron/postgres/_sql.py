"""The PostgreSQL backend's SQL: ``sql/queries.sql``, what lease mode runs instead of some
of them (``sql/lease.sql``), what a failover runs (``sql/failover.sql``), and
``sql/migrations/``."""

from __future__ import annotations

from functools import cache

from replicron.backends.sqlfiles import Migration, SqlFiles

__all__ = ["Migration", "migrations", "queries"]

_FILES = SqlFiles("replicron.postgres")


@cache
def queries() -> dict[str, str]:
    """Every named query of ``queries.sql``, ``lease.sql`` and ``failover.sql``."""
    found: dict[str, str] = {}
    for file in ("queries.sql", "lease.sql", "failover.sql"):
        named = _FILES.queries(file)
        if found.keys() & named.keys():
            raise RuntimeError(f"named twice: {sorted(found.keys() & named.keys())}")
        found |= named
    return found


@cache
def migrations() -> tuple[Migration, ...]:
    """The migrations in version order."""
    return _FILES.migrations()
