"""Lease mode under the conditions that break it first: the server out of reach for a moment,
statements of several replicas at once, replicas not yet upgraded in the namespace.

Backends are driven directly as in test_lease_mode (their housekeeping never runs by itself:
``heartbeat_interval=3600``); the server is cut off for real (connections refused and the
replica's server session terminated), and races are run on real concurrent connections.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from replicron.backends.base import ClaimRequest, ClaimStatus, RunRecord
from replicron.errors import ConfigurationError
from replicron.events import Outcome
from replicron.postgres._sql import queries
from tests.helpers import server_dsn
from tests.postgres.test_lease_mode import expire, lock_row, row, run
from tests.postgres.test_postgres_backend import claim, opened, record, release, sql, tick

CLAIMED, LOCKED = ClaimStatus.CLAIMED, ClaimStatus.LOCKED


@contextmanager
def unreachable(dsn: str, replica_id: str) -> Iterator[None]:
    """While inside: the database refuses every new connection, and the replica's server
    session is gone (as in an outage or a failover)."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false'.encode())
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name = %s",
            [name, f"replicron {replica_id}"],
        )
    try:
        yield
    finally:
        with psycopg.connect(server_dsn(), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true'.encode())


def test_a_run_ending_while_the_server_is_out_of_reach_frees_its_lock_later(dsn: str) -> None:
    """The outcome of a run that ended while the server could not be reached is written once
    it can; its job's lock row outlives the connection, so it is freed then too, not renewed
    by every heartbeat for as long as the replica lives (the job stopped across the cluster)."""

    async def main() -> None:
        async with (
            opened(dsn, "a", coordination="lease") as a,
            opened(dsn, "b", coordination="lease") as b,
        ):
            held = await claim(a, "report", 1, lock=True)
            assert (held.status, held.locked) == (CLAIMED, True)
            with unreachable(dsn, "a"):
                try:
                    await a._housekeeper.heartbeat()
                except ConnectionError:
                    pass
                else:
                    raise AssertionError("the heartbeat reached a server refusing connections")
                await release(a, record(held, "a"), unlock=True)  # kept to be written later
            await a._housekeeper.heartbeat()
            await a._writes.write_pending()
            assert row(dsn, held.run_id)[0] == "succeeded"
            assert lock_row(dsn, "report")[0] is None
            expire(dsn, "report")
            await a._housekeeper.heartbeat()  # renews nothing of the finished run
            following = await claim(b, "report", 2, lock=True)
            assert (following.status, following.locked) == (CLAIMED, True)

    run(main())


def test_a_replica_from_before_the_modes_counts_as_advisory(dsn: str) -> None:
    """A live replica whose heartbeats name no mode (its version predates migration 0005, as
    in a rolling upgrade) coordinates through advisory locks: a lease replica refuses to start
    beside it."""

    async def main() -> None:
        async with opened(dsn, "old", coordination="advisory"):
            sql(dsn, "UPDATE replicron_replicas SET coordination = NULL WHERE replica_id = 'old'")
            with pytest.raises(ConfigurationError, match=r"old \(advisory\)"):
                async with opened(dsn, "new", coordination="lease"):
                    pass

    run(main())


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_job_running_its_last_run_has_no_more_ticks_to_record_missed(
    dsn: str, coordination: str
) -> None:
    """max_runs as a miss record sees it: the job's last run, started under its lock and still
    going, counts in either mode, so a later tick is no tick of the job (nothing recorded)."""

    async def main() -> None:
        async with opened(dsn, "a", coordination=coordination) as a:
            [last] = await a.claim([ClaimRequest("once", tick(1), True, False, 1)])
            assert (last.status, last.locked) == (CLAIMED, True)
            later = RunRecord(
                "once", tick(2), Outcome.MISSED, "a", None, None, None, "late", False, 1
            )
            assert await a.record_unclaimed([later]) == [False]
            assert sql(dsn, "SELECT count(*) FROM replicron_runs WHERE job = 'once'") == [(1,)]

    run(main())


def test_a_heartbeat_and_a_claim_taking_the_same_job_locks_do_not_deadlock(dsn: str) -> None:
    """A claim takes its jobs' lock rows in job order; a heartbeat renewing several lock rows
    must take them in that order too, not in the order the rows lie in the table: else each
    holds one the other waits for, and the server rolls one back (a deadlock). The heartbeat
    is held, by a trigger waiting on a lock of the test's, right after it took its first row;
    the claim comes, takes its first row and waits; then the heartbeat goes on."""

    async def hold_two() -> list[int]:
        async with opened(dsn, "one", coordination="lease") as one:
            held = [await claim(one, job, 1, lock=True) for job in ("b", "a")]  # b lies first
            one._runs.close()  # gone without a word (killed): its lock rows stay
            return [c.run_id for c in held if c.run_id is not None]

    runs = run(hold_two())
    sql(
        dsn,
        "CREATE FUNCTION held_after_first() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NEW; END $$;"
        " CREATE TRIGGER held_after_first BEFORE UPDATE ON replicron_job_locks"
        " FOR EACH ROW WHEN (OLD.job = 'b') EXECUTE FUNCTION held_after_first()",
    )
    heartbeat = queries()["lease_heartbeat"].encode()
    lease_claim = queries()["lease_claim"].encode()
    beat = {
        "namespace": "",
        "run_ids": runs,
        "epochs": [0, 0],
        "locked_runs": runs,
        "replica": "one",
        "offset_ms": None,
        "stale_after": timedelta(seconds=30),
        "leaving": False,
        "contending": False,
        "leader_lease": timedelta(seconds=30),
    }
    ask = {
        "namespace": "",
        "jobs": ["a", "b"],
        "ticks": [tick(2)] * 2,
        "locks": [True, True],
        "tokens": [uuid.uuid4()] * 2,
        "manual": [False, False],
        "limits": [None, None],
        "replica": "two",
        "ahead": timedelta(0),
        "stale_after": timedelta(seconds=30),
    }
    failures: list[BaseException] = []

    def statement(query: bytes, params: dict[str, object], pids: list[int]) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pids.append(conn.info.backend_pid)
                conn.execute(query, params).fetchall()
        except BaseException as error:  # reported below
            failures.append(error)

    def waiting(pids: list[int], event_type: str) -> None:
        for _ in range(500):
            if pids and sql(
                dsn,
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                [pids[0]],
            ) == [(event_type,)]:
                return
            time.sleep(0.01)
        raise AssertionError(f"{pids} never waited on a {event_type}")

    with psycopg.connect(dsn, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(4242)")
        beating: list[int] = []
        claiming: list[int] = []
        threads = [
            threading.Thread(target=statement, args=(heartbeat, beat, beating)),
            threading.Thread(target=statement, args=(lease_claim, ask, claiming)),
        ]
        threads[0].start()
        waiting(beating, "Lock")  # held after the heartbeat took its first lock row
        threads[1].start()
        waiting(claiming, "Lock")  # the claim took a row and waits for another
        gate.execute("SELECT pg_advisory_unlock(4242)")
        for thread in threads:
            thread.join(timeout=30)
    assert failures == []
