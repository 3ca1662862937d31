"""The PostgreSQL backend's SQL: ``sql/queries.sql`` and ``sql/migrations/``."""

from __future__ import annotations

from functools import cache

from replicron.backends.sqlfiles import Migration, SqlFiles

__all__ = ["Migration", "migrations", "queries"]

_FILES = SqlFiles("replicron.postgres")


@cache
def queries() -> dict[str, str]:
    """Every named query of ``queries.sql``."""
    return _FILES.queries()


@cache
def migrations() -> tuple[Migration, ...]:
    """The migrations in version order."""
    return _FILES.migrations()
