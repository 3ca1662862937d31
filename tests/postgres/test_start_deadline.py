"""Starting in a herd: the first session has one start deadline, ``connect_timeout``, for
connecting, its settings and the check of which server it reached, and the steps of start-up
after it (migrating, the first clock samples and heartbeat) are tried again by it too. A try
that gets no answer in time (a hundred replicas starting at once on a small server) is made
again within it; past it, start-up fails with the last try's one line.

The slow server is a statement of the check that waits for a lock this test holds: it gets
no answer until its deadline ends the wait, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from replicron.postgres import BackendUnavailableError, PostgresBackend
from replicron.postgres._failover import ServerWatch
from replicron.postgres._session import LockSession
from replicron.postgres._sql import queries

KEY = 7_340_211
COORDINATIONS = ["advisory", "lease"]


def first_check_runs(
    monkeypatch: pytest.MonkeyPatch, query: str, params: dict[str, Any]
) -> list[bool]:
    """Each server check a replica makes as it starts, True for the first, which runs
    ``query`` before checking; the others check only."""
    real = ServerWatch.check
    made: list[bool] = []

    async def check(self: ServerWatch, run: Any) -> None:
        made.append(not made)
        if made[-1]:
            await run(query, params)
        await real(self, run)

    monkeypatch.setattr(ServerWatch, "check", check)
    return made


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each server check a replica makes as it starts, True for one that got no answer: the
    first waits for the lock the test holds, the others answer."""
    return first_check_runs(monkeypatch, "SELECT pg_advisory_lock(%(key)s)", {"key": KEY})


@pytest.fixture
def held(dsn: str) -> Iterator[None]:
    """The lock the slow checks wait for, held by this test."""
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [KEY])
        yield


def starts(dsn: str, coordination: Any) -> None:
    """A replica starts (and stops) with a start deadline of 10 s."""

    async def main() -> None:
        started = backend(dsn, coordination, connect_timeout=10)
        await started.open("r1")
        try:
            assert started.connected
        finally:
            await started.close()

    asyncio.run(main())


def backend(dsn: str, coordination: Any, connect_timeout: float) -> PostgresBackend:
    return PostgresBackend(
        dsn,
        heartbeat_interval=3600,
        statement_timeout=1.0,
        connect_timeout=connect_timeout,
        coordination=coordination,
    )


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_server_check_without_an_answer_is_tried_again_within_the_start_deadline(
    dsn: str, held: None, checks: list[bool], coordination: Any
) -> None:
    starts(dsn, coordination)
    assert checks[:2] == [True, False]  # the first got no answer in 1 s; the second did


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_session_the_server_ends_at_start_is_tried_again_within_the_start_deadline(
    dsn: str, monkeypatch: pytest.MonkeyPatch, coordination: Any
) -> None:
    """The server ends the first session as it is checked (an administrator's
    ``pg_terminate_backend``, a restart): start-up opens another and starts."""
    made = first_check_runs(monkeypatch, "SELECT pg_terminate_backend(pg_backend_pid())", {})
    starts(dsn, coordination)
    assert made[:2] == [True, False]


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_first_clock_sample_without_an_answer_is_tried_again_within_the_start_deadline(
    dsn: str, held: None, monkeypatch: pytest.MonkeyPatch, coordination: Any
) -> None:
    """Past the session's opening: the first of start-up's clock samples gets no answer (it
    waits for the test's lock instead); start-up samples again and starts."""
    real = LockSession.fetch
    samples: list[bool] = []

    async def fetch(
        self: LockSession, query: str, params: Any, *, retry: bool = False
    ) -> list[tuple[Any, ...]]:
        if query == queries()["clock_sample"]:
            samples.append(not samples)
            if samples[-1]:
                query, params = "SELECT pg_advisory_lock(%(key)s)", {"key": KEY}
        return await real(self, query, params, retry=retry)

    monkeypatch.setattr(LockSession, "fetch", fetch)

    async def main() -> None:
        started = backend(dsn, coordination, connect_timeout=10)
        await started.open("r1")
        await started.close()

    asyncio.run(main())
    assert samples[:2] == [True, False]


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_server_that_never_answers_fails_start_up_with_one_line_by_the_deadline(
    dsn: str, held: None, checks: list[bool], monkeypatch: pytest.MonkeyPatch, coordination: Any
) -> None:
    real = ServerWatch.check

    async def never(self: ServerWatch, run: Any) -> None:
        checks.append(True)
        await run("SELECT pg_advisory_lock(%(key)s)", {"key": KEY})
        await real(self, run)

    monkeypatch.setattr(ServerWatch, "check", never)
    began = time.monotonic()
    with pytest.raises(BackendUnavailableError) as caught:
        asyncio.run(backend(dsn, coordination, connect_timeout=3).open("r1"))
    took = time.monotonic() - began
    message = str(caught.value)
    assert message.startswith("cannot check the server: "), message
    assert "\n" not in message
    assert len(checks) >= 2  # tried again while the deadline allowed
    # By the start deadline, plus the giving up of the last statement (at most a second).
    assert took < 3 + 1.5


def test_a_refused_connection_fails_start_up_by_the_deadline() -> None:
    """No server at all (nothing listens): tried until the start deadline, then the one line
    of the last try."""
    began = time.monotonic()
    with pytest.raises(BackendUnavailableError) as caught:
        asyncio.run(PostgresBackend("postgresql://u@127.0.0.1:1/db", connect_timeout=1).open("r"))
    took = time.monotonic() - began
    assert str(caught.value).startswith("cannot connect to PostgreSQL: "), caught.value
    assert took < 1 + 1.5


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_server_that_refuses_the_database_fails_start_up_without_another_try(
    dsn: str, coordination: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal is the server's answer, not the want of one (a wrong database name, role or
    password): said at once, not tried again until the start deadline."""
    wrong = make_conninfo(dsn, dbname="no_such_database")
    with caplog.at_level("INFO", "replicron"), pytest.raises(BackendUnavailableError) as caught:
        asyncio.run(backend(wrong, coordination, connect_timeout=30).open("r1"))
    assert 'database "no_such_database" does not exist' in str(caught.value)
    assert "trying again" not in caplog.text
