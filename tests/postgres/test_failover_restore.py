"""What a replica does when the server changes under it (a failover), on one server: the
change is made to look real by telling the backend it saw another identity before, and the
loss of an asynchronous standby by deleting the replica's rows (and moving the run id
sequence back). tests/faults/test_failover.py does it with a real primary and standby."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from replicron.backends.base import Release
from replicron.events import Outcome
from replicron.postgres import PostgresBackend
from replicron.postgres._failover import ServerIdentity
from tests.postgres.test_postgres_backend import claim, record, session_pid, sql, tick

CHANGED = "the server changed under this replica"
modes = pytest.mark.parametrize("coordination", ["advisory", "lease"])


@asynccontextmanager
async def opened(
    dsn: str, replica_id: str, lost: list[int], **options: object
) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(dsn, heartbeat_interval=3600, **options)  # type: ignore[arg-type]
    await backend.open(replica_id, lost.extend)
    try:
        yield backend
    finally:
        await backend.close()


def pretend_it_was_another_server(backend: PostgresBackend) -> ServerIdentity:
    """Make the backend remember another server than the one it talks to."""
    now = backend.server_identity
    assert now is not None
    backend._housekeeper.server.identity = ServerIdentity(now.system, now.timeline + 7)
    return now


def lose_rows(dsn: str, replica_id: str) -> None:
    """What an asynchronous standby that was behind would lack: the replica's rows, and the
    run ids it was given."""
    sql(dsn, "DELETE FROM replicron_runs WHERE replica_id = %s", [replica_id])
    sql(dsn, "SELECT setval(pg_get_serial_sequence('replicron_runs', 'run_id'), 1)")


def reconnect(dsn: str, backend: PostgresBackend, replica_id: str) -> None:
    """End the backend's connection: its next statement opens a new one."""
    if backend.coordination == "advisory":
        sql(dsn, "SELECT pg_terminate_backend(%s, 5000)", [session_pid(dsn, replica_id)])
    else:
        assert backend._session is not None
        backend._session.invalidate()


@modes
def test_after_a_failover_the_rows_the_new_server_lacks_are_put_back(
    dsn: str, coordination: str, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[int] = []

    async def main() -> None:
        async with opened(dsn, "replica-a", lost, coordination=coordination) as a:
            done = await claim(a, "cleanup", 1, lock=True)
            await a.release([Release(record(done, "replica-a"), True)])
            going = await claim(a, "cleanup", 2, lock=True)  # still running at the failover
            assert a.server_changes == 0
            was = pretend_it_was_another_server(a)
            lose_rows(dsn, "replica-a")
            reconnect(dsn, a, "replica-a")
            await a.last_ticks(["cleanup"])  # any statement: on a new connection
            assert a.server_changes == 1
            assert a.server_identity == was
            assert lost == [going.run_id]  # told to stop: recorded abandoned
            rows = sql(
                dsn,
                "SELECT run_id, scheduled_at, outcome, error FROM replicron_runs ORDER BY 1",
            )
            assert [row[:3] for row in rows] == [
                (done.run_id, tick(1), "succeeded"),
                (going.run_id, tick(2), "abandoned"),
            ]
            assert "put back after a failover" in rows[1][3]
            # The abandoned run's own write finds its row as it was put back.
            await a.release([Release(record(going, "replica-a", Outcome.ABANDONED), True)])
            # Run ids stay fencing tokens: the sequence moved past the ones put back.
            later = await claim(a, "cleanup", 3, lock=True)
            assert later.run_id is not None
            assert going.run_id is not None
            assert later.run_id > going.run_id
            await a.release([Release(record(later, "replica-a"), True)])

    with caplog.at_level(logging.INFO, "replicron"):
        asyncio.run(main())
    changed = [r for r in caplog.records if CHANGED in r.getMessage()]
    assert [r.levelno for r in changed] == [logging.ERROR]  # said once
    assert "timeline" in changed[0].getMessage()
    assert "of the 2 ledger rows this replica wrote lately the new server lacked 2" in caplog.text


@modes
def test_a_tick_claimed_again_on_the_new_server_is_said_to_have_run_twice(
    dsn: str, coordination: str, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[int] = []

    async def main() -> None:
        async with opened(dsn, "replica-a", lost, coordination=coordination) as a:
            twice = await claim(a, "cleanup", 1, lock=True)
            await a.release([Release(record(twice, "replica-a", started_at=tick(1)), True)])
            missed = await claim(a, "report", 1, lock=True)
            await a.release([Release(record(missed, "replica-a", started_at=tick(1)), True)])
            pretend_it_was_another_server(a)
            lose_rows(dsn, "replica-a")
            # On the new server, replica-b claimed and ran the first tick again, and recorded
            # the other missed.
            sql(
                dsn,
                "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id, outcome)"
                " VALUES ('', 'cleanup', %s, 'replica-b', 'succeeded'),"
                " ('', 'report', %s, 'replica-b', 'missed')",
                [tick(1), tick(1)],
            )
            reconnect(dsn, a, "replica-a")
            await a.last_ticks(["cleanup"])
            rows = sql(dsn, "SELECT job, replica_id, outcome FROM replicron_runs ORDER BY job")
            assert rows == [
                ("cleanup", "replica-b", "succeeded"),  # kept
                ("report", "replica-a", "succeeded"),  # it did run: not missed
            ]

    with caplog.at_level(logging.ERROR, "replicron"):
        asyncio.run(main())
    said = caplog.text
    assert f"job 'cleanup' tick {tick(1).isoformat()} ran here as run" in said
    assert "claimed again on the new server by replica replica-b" in said
    assert "it may have run twice" in said


@modes
def test_an_outcome_that_did_not_make_it_across_is_written_again(
    dsn: str, coordination: str
) -> None:
    lost: list[int] = []

    async def main() -> None:
        async with opened(dsn, "replica-a", lost, coordination=coordination) as a:
            done = await claim(a, "cleanup", 1, lock=True)
            await a.release([Release(record(done, "replica-a"), True)])
            pretend_it_was_another_server(a)
            # The standby had the claim, not the outcome.
            sql(
                dsn,
                "UPDATE replicron_runs SET outcome = NULL, finished_at = NULL WHERE run_id = %s",
                [done.run_id],
            )
            reconnect(dsn, a, "replica-a")
            await a.last_ticks(["cleanup"])
            rows = sql(dsn, "SELECT run_id, outcome FROM replicron_runs")
            assert rows == [(done.run_id, "succeeded")]

    asyncio.run(main())


def test_a_lease_heartbeat_notices_a_change_of_server(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In lease mode, connections may come from a pool: the heartbeat checks the server."""
    lost: list[int] = []

    async def main() -> None:
        async with opened(dsn, "replica-a", lost, coordination="lease") as a:
            going = await claim(a, "cleanup", 1, lock=True)
            pretend_it_was_another_server(a)
            await a._housekeeper.heartbeat()
            assert a.server_changes == 1
            assert lost == [going.run_id]
            await a._housekeeper.heartbeat()  # the same server: nothing more
            assert a.server_changes == 1

    with caplog.at_level(logging.ERROR, "replicron"):
        asyncio.run(main())
    assert caplog.text.count(CHANGED) == 1


def test_rows_the_server_refuses_to_take_back_are_given_up_with_an_error(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[int] = []

    async def main() -> None:
        async with opened(dsn, "replica-a", lost) as a:
            done = await claim(a, "cleanup", 1, lock=True)
            await a.release([Release(record(done, "replica-a"), True)])
            pretend_it_was_another_server(a)
            lose_rows(dsn, "replica-a")
            sql(
                dsn,
                "ALTER TABLE replicron_runs ADD CONSTRAINT no_cleanup CHECK (job <> 'cleanup')"
                " NOT VALID",
            )
            reconnect(dsn, a, "replica-a")
            await a.last_ticks(["cleanup"])  # the connection is fine: the replica goes on
            assert a.server_changes == 1
            assert not a._housekeeper.server.pending  # not tried on every connection

    with caplog.at_level(logging.ERROR, "replicron"):
        asyncio.run(main())
    assert "could not put back the ledger rows this replica wrote before the failover" in (
        caplog.text
    )
