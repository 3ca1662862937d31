"""SQL kept in ``.sql`` files beside the code that runs it: named queries and numbered
migrations, for the embedded (SQLite) and PostgreSQL backends alike."""

from __future__ import annotations

import re
from importlib import resources
from typing import NamedTuple

__all__ = ["Migration", "SqlFiles"]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


class Migration(NamedTuple):
    version: int
    name: str
    sql: str


class SqlFiles:
    """The ``sql`` directory of ``package``: ``queries.sql`` (queries under ``-- name: x``
    lines) and ``migrations/NNNN_name.sql``."""

    def __init__(self, package: str) -> None:
        self.package = package

    def _dir(self) -> resources.abc.Traversable:
        return resources.files(self.package).joinpath("sql")

    def read(self, name: str) -> str:
        return self._dir().joinpath(name).read_text(encoding="utf-8")

    def queries(self, file: str = "queries.sql") -> dict[str, str]:
        """Every named query of ``file`` (in the package's ``sql`` folder)."""
        parts = _NAME.split(self.read(file))
        # parts: [preamble, name1, body1, name2, body2, ...]
        found = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
        if len(found) != len(parts[1::2]):
            raise RuntimeError(f"{self.package}: {file} names a query twice")
        return found

    def migrations(self) -> tuple[Migration, ...]:
        """The migrations in version order; versions must run 1, 2, 3 ... without gaps."""
        found = []
        for entry in self._dir().joinpath("migrations").iterdir():
            match = _MIGRATION_FILE.match(entry.name)
            if match:
                found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
        found.sort()
        if [m.version for m in found] != list(range(1, len(found) + 1)):
            raise RuntimeError(f"migrations must be numbered 1..n without gaps: {found}")
        return tuple(found)
