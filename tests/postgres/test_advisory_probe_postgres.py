"""The advisory-lock probe on a real PostgreSQL: it passes, and leaves no lock behind."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from replicron.postgres import BackendUnavailableError, UntrustedAdvisoryLocksError
from replicron.postgres._probe import PsycopgProbeSession, check_advisory_locks, open_probe_session

#: Advisory locks of the two-int key space (the probe's), on any session of this database.
TWO_INT_LOCKS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def two_int_locks(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(TWO_INT_LOCKS).fetchone()
    assert row is not None
    return int(row[0])


def test_the_probe_passes_on_postgresql(dsn: str) -> None:
    asyncio.run(check_advisory_locks(lambda: open_probe_session(dsn, 5.0)))
    assert two_int_locks(dsn) == 0


def test_one_server_session_posing_as_two_is_refused(dsn: str) -> None:
    # What a transaction pooler may do: hand both "sessions" the same server session, whose
    # advisory locks are re-entrant. The probe sees a second session get a held lock.
    async def probe() -> None:
        shared = await open_probe_session(dsn, 5.0)

        async def same() -> PsycopgProbeSession:
            return shared

        await check_advisory_locks(same)

    with pytest.raises(UntrustedAdvisoryLocksError) as caught:
        asyncio.run(probe())
    message = str(caught.value)
    assert "a second session also got the lock" in message
    assert 'coordination="lease"' in message
    assert "PostgreSQL" in message
    assert two_int_locks(dsn) == 0  # unlocked (twice: re-entrant) and closed


def test_a_server_that_cannot_be_reached_is_unavailable_not_refused() -> None:
    with pytest.raises(BackendUnavailableError) as caught:
        asyncio.run(check_advisory_locks(lambda: open_probe_session("host=127.0.0.1 port=1", 2)))
    assert not isinstance(caught.value, UntrustedAdvisoryLocksError)
