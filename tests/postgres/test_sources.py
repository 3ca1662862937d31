"""Where PostgresBackend gets its connection: a DSN, a psycopg pool (conninfo *and* kwargs),
an SQLAlchemy engine or URL. Each must reach the database it names, and no other."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from replicron import ConfigurationError
from replicron.postgres import PostgresBackend, migrate
from tests.helpers import fresh_database


@pytest.fixture
def other() -> Iterator[str]:
    """A second fresh database: the one the sources below must *not* reach."""
    with fresh_database("replicron_other") as url:
        yield url


def tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'replicron_%'"
        ).fetchall()
    return {name for (name,) in rows}


def open_and_close(backend: PostgresBackend) -> None:
    async def run() -> None:
        await backend.open("r1")
        await backend.close()

    asyncio.run(run())


def test_a_pool_with_its_database_in_kwargs_reaches_that_database(dsn: str, other: str) -> None:
    params = {k: str(v) for k, v in conninfo_to_dict(other).items() if v is not None}
    dbname = params.pop("dbname")
    # The conninfo names no database (libpq would pick the user's): the kwargs do, beside a
    # connection option that is not a libpq parameter.
    pool = ConnectionPool(
        psycopg.conninfo.make_conninfo("", **params),
        kwargs={"dbname": dbname, "autocommit": True},
        open=False,
    )
    open_and_close(PostgresBackend(pool))
    assert "replicron_runs" in tables(other)
    assert "replicron_runs" not in tables(dsn)
    async_pool = AsyncConnectionPool(
        psycopg.conninfo.make_conninfo("", **params), kwargs={"dbname": dbname}, open=False
    )
    assert conninfo_to_dict(PostgresBackend(async_pool).conninfo)["dbname"] == dbname


def test_an_sqlalchemy_engine_or_url_reaches_its_database(other: str) -> None:
    params = {k: str(v) for k, v in conninfo_to_dict(other).items() if v is not None}
    url = sqlalchemy.engine.URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        password="not-checked#by-trust-auth",
        host=params.get("host"),
        port=int(params.get("port", "5432")),
        database=params["dbname"],
    )
    engine = sqlalchemy.create_engine(url)
    try:
        backend = PostgresBackend(engine)
        assert conninfo_to_dict(backend.conninfo)["password"] == "not-checked#by-trust-auth"
        open_and_close(backend)
    finally:
        engine.dispose()
    assert "replicron_runs" in tables(other)
    assert asyncio.run(migrate(url)) == []  # the URL object works the same: up to date


def test_anything_else_is_refused_with_what_is_taken() -> None:
    with pytest.raises(ConfigurationError, match="a DSN, a psycopg pool, or an SQLAlchemy"):
        PostgresBackend(5)  # type: ignore[arg-type]


def test_a_pool_whose_settings_are_functions(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, open=False)
    assert PostgresBackend(pool).conninfo == dsn

    async def later() -> str:
        return dsn

    async_pool = AsyncConnectionPool(later, open=False)
    with pytest.raises(ConfigurationError, match="conninfo is an async function"):
        PostgresBackend(async_pool)
