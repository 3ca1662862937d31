"""The embedded backend's SQL: the named statements of ``sql/queries.sql`` and the migrations
of ``sql/migrations/``, read on first use (not on import)."""

from __future__ import annotations

import functools

from .sqlfiles import Migration, SqlFiles

__all__ = ["migration_files", "sql"]

_FILES = SqlFiles("replicron.backends")


@functools.cache
def _queries() -> dict[str, str]:
    return _FILES.queries()


def sql(name: str) -> str:
    """The statement named ``name`` in ``queries.sql``."""
    return _queries()[name]


def migration_files() -> tuple[Migration, ...]:
    return _FILES.migrations()
