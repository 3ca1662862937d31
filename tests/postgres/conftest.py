"""A fresh PostgreSQL database per test, from the server named by REPLICRON_TEST_DSN.

Tests here skip when the variable is unset (a laptop without PostgreSQL); CI sets it and
fails when the server cannot be reached.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import fresh_database


@pytest.fixture
def dsn() -> Iterator[str]:
    with fresh_database() as url:
        yield url
