"""A fresh PostgreSQL database per test, from the server named by REPLICRON_TEST_DSN.

Tests here skip when the variable is unset (a laptop without PostgreSQL); CI sets it and
fails when the server cannot be reached.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo


def _server_dsn() -> str:
    dsn = os.environ.get("REPLICRON_TEST_DSN")
    if not dsn:
        pytest.skip("REPLICRON_TEST_DSN is not set")
    return dsn


@pytest.fixture
def dsn() -> Iterator[str]:
    server = _server_dsn()
    name = f"replicron_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
