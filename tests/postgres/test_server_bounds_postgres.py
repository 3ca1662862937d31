"""The server's own bounds on replicron's statements: one the replica gave up on (behind a
locked ledger) must end on the server by the same deadline, whatever the connection came
from (a DSN, the application's psycopg pool, an SQLAlchemy engine), and the cluster's reads
must not wait for the lock either."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from replicron.backends.base import ClaimRequest
from replicron.postgres import BackendUnavailableError, PostgresBackend
from tests.helpers import poll_until

#: The statement deadline of these tests (seconds): short, and shorter than the lease.
DEADLINE = 0.3


@contextmanager
def locked_ledger(dsn: str) -> Iterator[int]:
    """``LOCK TABLE replicron_runs IN ACCESS EXCLUSIVE MODE`` from a session of its own, held
    until the block ends; its server pid."""
    with psycopg.connect(dsn, application_name="test holder") as holder:
        holder.execute("LOCK TABLE replicron_runs IN ACCESS EXCLUSIVE MODE")
        yield holder.info.backend_pid
        holder.rollback()


def waiting_behind(dsn: str, holder: int) -> list[tuple[int, str]]:
    """(pid, application_name) of every session waiting for a lock ``holder`` holds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE %s = ANY(pg_blocking_pids(pid))",
            (holder,),
        ).fetchall()
    return [(int(pid), str(app)) for pid, app in rows]


@asynccontextmanager
async def lease_backend(dsn: str, source: str) -> AsyncIterator[PostgresBackend]:
    """A lease-mode backend (open, as replica "r1") whose connection comes from ``source``."""
    options = {"coordination": "lease", "heartbeat_interval": 3600, "statement_timeout": DEADLINE}
    if source == "a DSN":
        backend = PostgresBackend(dsn, **options)  # type: ignore[arg-type]
    elif source == "an SQLAlchemy engine":
        params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
        engine = sqlalchemy.create_engine(
            sqlalchemy.engine.URL.create(
                "postgresql+psycopg",
                username=params.get("user"),
                host=params.get("host"),
                port=int(params.get("port", "5432")),
                database=params["dbname"],
            )
        )
        backend = PostgresBackend(engine, **options)  # type: ignore[arg-type]
        engine.dispose()  # only its URL is read
    else:
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open()
        backend = PostgresBackend(pool, **options)  # type: ignore[arg-type]
    await backend.open("r1")
    try:
        yield backend
    finally:
        await backend.close()
        if source == "the application's pool":
            await pool.close()


@pytest.mark.parametrize("source", ["a DSN", "the application's pool", "an SQLAlchemy engine"])
def test_a_claim_given_up_on_behind_a_locked_ledger_ends_on_the_server(
    dsn: str, source: str
) -> None:
    """Before, the claim the replica gave up on waited on the server for as long as the lock
    was held (closing the client's socket does not end a wait for a lock)."""

    async def main() -> None:
        async with lease_backend(dsn, source) as backend:
            with locked_ledger(dsn) as holder:
                tick = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
                given_up = time.monotonic()
                with pytest.raises(BackendUnavailableError):
                    await backend.claim([ClaimRequest("report", tick, True)])
                poll_until(
                    "the claim to end on the server",
                    lambda: not waiting_behind(dsn, holder),
                    DEADLINE + 1.0,
                    every=0.02,
                )
                ended = time.monotonic() - given_up
        assert ended < 2 * DEADLINE + 1.0, ended

    asyncio.run(main())


def test_a_cluster_status_read_behind_a_locked_ledger_ends_at_the_statement_timeout(
    dsn: str,
) -> None:
    """The status read (``replicron status``, the status page, the daemon's readiness and
    metrics) opens a connection of its own: before, it waited for the lock as long as it was
    held."""

    async def main() -> None:
        backend = PostgresBackend(dsn, statement_timeout=DEADLINE)
        await backend.open("r1")
        try:
            with locked_ledger(dsn) as holder:
                started = time.monotonic()
                with pytest.raises(BackendUnavailableError, match=r"no answer within 0\.3 s"):
                    await asyncio.wait_for(backend.cluster_status(), 5)
                took = time.monotonic() - started
                assert waiting_behind(dsn, holder) == []
        finally:
            await backend.close()
        assert took < DEADLINE + 1.0, took

    asyncio.run(main())


def test_the_lock_session_compiles_no_statement(dsn: str) -> None:
    """Advisory mode's lock session has JIT off on the server: a claim of thousands of ticks
    is estimated costly enough to be compiled, which takes longer than running it."""

    async def main() -> None:
        backend = PostgresBackend(dsn, heartbeat_interval=3600)
        await backend.open("r1")
        try:
            session = backend._statements.session
            assert session is not None
            [(jit,)] = await session.fetch("SELECT current_setting('jit')", {})
            assert jit == "off"
        finally:
            await backend.close()

    with psycopg.connect(dsn, autocommit=True) as conn:  # PostgreSQL's default, made sure of
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET jit = on")
    asyncio.run(main())


@pytest.mark.parametrize("source", ["a DSN", "the application's pool"])
def test_a_statement_given_up_on_is_said_once_not_also_by_psycopg(
    dsn: str, source: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Giving up on a statement, replicron stops psycopg's own wait for the server's
    cancellation; psycopg then warns that it closes the connection. That is replicron's
    doing, said by its own error (and health line): psycopg's warning is not logged with it,
    while one of the application's own statements is left alone."""

    async def main() -> None:
        async with lease_backend(dsn, source) as backend:
            with locked_ledger(dsn):
                tick = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
                with pytest.raises(BackendUnavailableError):
                    await backend.claim([ClaimRequest("report", tick, True)])

    with caplog.at_level(logging.WARNING, logger="psycopg"):
        asyncio.run(main())
        assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == []
        logging.getLogger("psycopg").warning("query cancellation interrupted (the app's)")
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == [
        "query cancellation interrupted (the app's)"
    ]
