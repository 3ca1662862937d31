"""SQL kept in ``.sql`` files: named queries and numbered migrations."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import NamedTuple

__all__ = ["Migration", "migrations", "queries"]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


class Migration(NamedTuple):
    version: int
    name: str
    sql: str


def _sql_dir() -> resources.abc.Traversable:
    return resources.files("replicron.postgres").joinpath("sql")


@cache
def queries() -> dict[str, str]:
    """Every named query of ``queries.sql``."""
    text = _sql_dir().joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    found = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    if len(found) != len(parts[1::2]):
        raise RuntimeError("queries.sql names a query twice")
    return found


@cache
def migrations() -> tuple[Migration, ...]:
    """The migrations in version order; versions must run 1, 2, 3 ... without gaps."""
    found = []
    for entry in _sql_dir().joinpath("migrations").iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort()
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps: {found}")
    return tuple(found)
