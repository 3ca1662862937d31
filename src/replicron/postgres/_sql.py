"""The PostgreSQL backend's SQL: ``sql/queries.sql``, what lease mode runs instead of some
of them (``sql/lease.sql``), and ``sql/migrations/``."""

from __future__ import annotations

from functools import cache

from replicron.backends.sqlfiles import Migration, SqlFiles

__all__ = ["Migration", "migrations", "queries"]

_FILES = SqlFiles("replicron.postgres")


@cache
def queries() -> dict[str, str]:
    """Every named query of ``queries.sql`` and ``lease.sql``."""
    common = _FILES.queries()
    leased = _FILES.queries("lease.sql")
    if common.keys() & leased.keys():
        raise RuntimeError(f"named in both files: {sorted(common.keys() & leased.keys())}")
    return common | leased


@cache
def migrations() -> tuple[Migration, ...]:
    """The migrations in version order."""
    return _FILES.migrations()
