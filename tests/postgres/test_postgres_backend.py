"""PostgresBackend beyond the shared contract (tests/contract): migrations, signed lock keys in
pg_locks, key collisions, no lock left after close, the ledger row, heartbeats, the janitor,
and runs that outlive their replica's session.

Every handle's housekeeper sleeps an hour first (``heartbeat_interval=3600``), so it never runs
during a test: heartbeats and the janitor are invoked explicitly, and staleness is produced by
moving ``heartbeat_at`` into the past with SQL, never by waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from replicron import job_lock_key
from replicron.backends.base import Claim, ClaimRequest, ClaimStatus, Release, RunRecord
from replicron.errors import ConfigurationError
from replicron.events import Outcome
from replicron.postgres import (
    LockKeyCollisionError,
    PostgresBackend,
    migrate,
)
from replicron.postgres._sql import migrations, queries
from replicron.postgres.migrate import MIGRATION_LOCK_KEY
from tests.helpers import z

CLAIMED, TAKEN, LOCKED = ClaimStatus.CLAIMED, ClaimStatus.TAKEN, ClaimStatus.LOCKED
T0 = z(2024, 1, 1)
#: Go's hash/fnv vectors (tests/unit/test_keys.py): name -> unsigned FNV-1a 64.
UNSIGNED_KEYS = {
    "cleanup": 12418740963103222451,  # >= 2**63: sent as -6028003110606329165
    "job-42": 9959384804527333285,  # >= 2**63: sent as -8487359269182218331
    "nightly-report": 4417635575514249131,  # < 2**63: sent as is
}


def tick(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def sql(dsn: str, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query.encode(), params)
        return cursor.fetchall() if cursor.description else []


def advisory_locks(dsn: str) -> list[tuple[int, int, int, int, str, bool]]:
    """(pid, classid, objid, objsubid, mode, granted) of every advisory lock in this database."""
    return sql(
        dsn,
        "SELECT l.pid, l.classid::bigint, l.objid::bigint, l.objsubid, l.mode, l.granted"
        " FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
        " ORDER BY l.pid, l.classid, l.objid",
    )


def held_keys(dsn: str) -> dict[int, int]:
    """Signed lock key -> pid holding it, rebuilt from pg_locks' two 32-bit halves."""
    keys = {}
    for pid, classid, objid, objsubid, _, granted in advisory_locks(dsn):
        assert (objsubid, granted) == (1, True)  # 1: a lock on one bigint key
        unsigned = (classid << 32) | objid
        keys[unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned] = pid
    return keys


def session_pid(dsn: str, replica_id: str) -> int:
    [(pid,)] = sql(
        dsn,
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        [f"replicron {replica_id}"],
    )
    return int(pid)


def record(
    claimed: Claim,
    replica_id: str,
    outcome: Outcome = Outcome.SUCCEEDED,
    *,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    error: str | None = None,
) -> RunRecord:
    return RunRecord(
        claimed.job,
        claimed.scheduled_at,
        outcome,
        replica_id,
        claimed.run_id,
        started_at,
        finished_at,
        error,
    )


async def claim(backend: PostgresBackend, job: str, n: int, *, lock: bool) -> Claim:
    [result] = await backend.claim([ClaimRequest(job, tick(n), lock)])
    return result


async def release(backend: PostgresBackend, rec: RunRecord, *, unlock: bool) -> None:
    await backend.release([Release(rec, unlock)])


@asynccontextmanager
async def opened(
    dsn: str, replica_id: str, lost: list[int] | None = None, **options: Any
) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(dsn, **{"heartbeat_interval": 3600, **options})
    await backend.open(replica_id, None if lost is None else lost.extend)
    try:
        yield backend
    finally:
        await backend.close()


# ---- migrations -------------------------------------------------------------------------


#: Every migration, as migrate() names those it applied and as replicron_migrations records them.
ALL_MIGRATIONS = [f"{m.version:04d}_{m.name}" for m in migrations()]
RECORDED = [(m.version, m.name) for m in migrations()]


def test_migrations_are_applied_once_and_recorded(dsn: str) -> None:
    assert len(ALL_MIGRATIONS) >= 2
    assert asyncio.run(migrate(dsn)) == ALL_MIGRATIONS
    rows = sql(dsn, "SELECT version, name, applied_at FROM replicron_migrations ORDER BY 1")
    assert [(version, name) for version, name, _ in rows] == RECORDED
    assert sql(dsn, "SELECT to_regclass('replicron_runs') IS NOT NULL") == [(True,)]
    assert sql(dsn, "SELECT to_regclass('replicron_replicas') IS NOT NULL") == [(True,)]

    assert asyncio.run(migrate(dsn)) == []
    assert sql(dsn, "SELECT * FROM replicron_migrations ORDER BY 1") == rows

    async def open_and_close() -> None:  # open() migrates too: nothing left to apply
        async with opened(dsn, "replica-a"):
            pass

    asyncio.run(open_and_close())
    assert sql(dsn, "SELECT * FROM replicron_migrations ORDER BY 1") == rows
    assert advisory_locks(dsn) == []  # the migration lock was released


def test_concurrent_migrations_apply_each_migration_once(dsn: str) -> None:
    async def main() -> list[list[str]]:
        return list(await asyncio.gather(*(migrate(dsn) for _ in range(4))))

    assert sorted(asyncio.run(main())) == [[], [], [], ALL_MIGRATIONS]
    assert sql(dsn, "SELECT version, name FROM replicron_migrations ORDER BY 1") == RECORDED
    assert advisory_locks(dsn) == []


def test_a_database_of_an_earlier_version_is_upgraded_keeping_its_rows(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE replicron_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for m in migrations()[:2]:
            conn.execute(m.sql.encode())
            conn.execute("INSERT INTO replicron_migrations VALUES (%s, %s)", (m.version, m.name))
        conn.execute(
            "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id, outcome)"
            " VALUES ('', 'report', %s, 'old', 'succeeded')",
            (tick(3),),
        )
    assert asyncio.run(migrate(dsn)) == ALL_MIGRATIONS[2:]

    async def main() -> None:
        async with opened(dsn, "replica-a") as backend:
            assert await backend.last_ticks(["report"]) == {"report": tick(3)}
            assert (await claim(backend, "report", 3, lock=False)).status is TAKEN

    asyncio.run(main())
    assert sql(dsn, "SELECT job, manual FROM replicron_runs") == [("report", False)]


def test_replicas_opening_together_on_an_empty_database(dsn: str) -> None:
    async def main() -> list[ClaimStatus]:
        backends = [PostgresBackend(dsn, heartbeat_interval=3600) for _ in range(3)]
        await asyncio.gather(*(b.open(f"replica-{i}") for i, b in enumerate(backends)))
        try:
            claims = await asyncio.gather(*(claim(b, "report", 1, lock=False) for b in backends))
            return sorted((c.status for c in claims), key=lambda s: s.value)
        finally:
            for backend in backends:
                await backend.close()

    assert asyncio.run(main()) == [CLAIMED, TAKEN, TAKEN]
    assert sql(dsn, "SELECT version, name FROM replicron_migrations ORDER BY 1") == RECORDED


def test_open_migrates_on_the_lock_session(dsn: str) -> None:
    """The backend migrates on its lock session, not on a connection of its own: seen while
    its migration waits for the migration lock, held meanwhile by another session."""

    async def main() -> tuple[list[int], int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as holder:
            await holder.execute("SELECT pg_advisory_lock(%s::bigint)", [MIGRATION_LOCK_KEY])
            backend = PostgresBackend(dsn, heartbeat_interval=3600)
            opening = asyncio.create_task(backend.open("replica-a"))
            waiting: list[int] = []
            try:
                for _ in range(500):  # up to 10 s for its migration to queue for the lock
                    waiting = [pid for pid, *_, granted in advisory_locks(dsn) if not granted]
                    if waiting or opening.done():
                        break
                    await asyncio.sleep(0.02)
                lock_session = session_pid(dsn, "replica-a")
                await holder.execute("SELECT pg_advisory_unlock_all()")
                await opening
                assert session_pid(dsn, "replica-a") == lock_session  # the same session
            finally:
                await backend.close()
        return waiting, lock_session

    waiting, lock_session = asyncio.run(main())
    assert waiting == [lock_session]
    assert sql(dsn, "SELECT version, name FROM replicron_migrations ORDER BY 1") == RECORDED
    assert advisory_locks(dsn) == []


# ---- lock keys --------------------------------------------------------------------------


@pytest.mark.parametrize("job", list(UNSIGNED_KEYS))
def test_lock_keys_are_sent_as_signed_bigint(dsn: str, job: str) -> None:
    unsigned = UNSIGNED_KEYS[job]
    signed = unsigned - 2**64 if unsigned >= 2**63 else unsigned
    assert job_lock_key(job) == signed

    async def main() -> None:
        lost: list[int] = []
        async with opened(dsn, "replica-a", lost) as backend:
            pid = session_pid(dsn, "replica-a")
            # Taken by the claim query ...
            won = await claim(backend, job, 1, lock=True)
            assert (won.status, won.locked) == (CLAIMED, True)
            assert advisory_locks(dsn) == [
                (pid, unsigned >> 32, unsigned & 0xFFFFFFFF, 1, "ExclusiveLock", True)
            ]
            assert held_keys(dsn) == {signed: pid}
            # ... found by the heartbeat's own look at pg_locks (no false "lock lost") ...
            await backend._housekeeper.heartbeat()
            assert lost == []
            # ... and dropped by the release query.
            await release(backend, record(won, "replica-a"), unlock=True)
            assert advisory_locks(dsn) == []
            # The lock query (a queued run) sends the same key.
            queued = await claim(backend, job, 2, lock=False)
            assert await backend.lock(queued) is True
            assert held_keys(dsn) == {signed: pid}
            await backend._housekeeper.heartbeat()
            assert lost == []
            await release(backend, record(queued, "replica-a"), unlock=True)
            assert advisory_locks(dsn) == []

    asyncio.run(main())


class OneKeyBackend(PostgresBackend):
    """Every job name gets lock key 42: a collision a test can produce.

    A real one cannot be: no two job names with the same FNV-1a 64 hash are known to us, and a
    birthday search needs about 2**32 hashes (hours of Python and tens of GB), so the check is
    driven through the one method it depends on instead.
    """

    def lock_key(self, job: str) -> int:
        return 42


def test_a_lock_key_collision_is_refused_at_registration() -> None:
    backend = OneKeyBackend("postgresql://unused")  # registration does not connect
    backend.register_job("cleanup")
    backend.register_job("cleanup")  # the same name again is no collision
    with pytest.raises(LockKeyCollisionError) as caught:
        backend.register_job("job-42")
    assert str(caught.value) == (
        "job 'job-42' has the same lock key (42) as job 'cleanup': rename one"
    )
    assert isinstance(caught.value, ConfigurationError)
    backend.unregister_job("cleanup")
    backend.register_job("job-42")  # the key is free again
    with pytest.raises(LockKeyCollisionError):
        backend.register_job("cleanup")


@pytest.mark.parametrize(
    ("namespace", "said"),
    [
        ("billing\x00/", r"namespace 'billing\x00/' contains control characters"),
        ("billing\n", r"namespace 'billing\n' contains control characters"),
    ],
)
@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_namespace_the_ledger_or_a_log_line_cannot_hold_is_refused_at_construction(
    dsn: str, namespace: str, said: str, coordination: Any
) -> None:
    async def start() -> None:
        backend = PostgresBackend(dsn, namespace=namespace, coordination=coordination)
        await backend.open("r1")  # where a NUL failed before, with psycopg's DataError
        await backend.close()

    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(start())
    assert str(caught.value).startswith(said)


def test_distinct_names_and_repeated_names_register_on_the_real_keys() -> None:
    backend = PostgresBackend("postgresql://unused")
    for name in [*UNSIGNED_KEYS, "cleanup", "job-42", "a", "b"]:
        backend.register_job(name)


# ---- the ledger row ---------------------------------------------------------------------


def test_claim_and_release_write_the_ledger_row(dsn: str) -> None:
    columns = (
        "replica_id, outcome, error, started_at IS NULL, started_at = claimed_at,"
        " heartbeat_at IS NULL, heartbeat_at = claimed_at, finished_at"
    )

    def row(run_id: int | None) -> tuple[Any, ...]:
        [found] = sql(dsn, f"SELECT {columns} FROM replicron_runs WHERE run_id = %s", [run_id])
        return tuple(found)

    async def main() -> None:
        async with opened(dsn, "replica-a") as a, opened(dsn, "replica-b") as b:
            run = await claim(a, "report", 1, lock=True)
            queued = await claim(b, "report", 2, lock=False)
            later = await claim(a, "report", 3, lock=False)
            # Open rows: heartbeat set at the claim; started only if it took the lock.
            assert row(run.run_id) == ("replica-a", None, None, False, True, False, True, None)
            assert row(queued.run_id) == ("replica-b", None, None, True, None, False, True, None)

            started, finished = z(2024, 1, 1, 0, 2, 5), z(2024, 1, 1, 0, 2, 9)
            await release(a, record(run, "replica-a", finished_at=finished), unlock=True)
            failed = record(
                queued,
                "replica-b",
                Outcome.FAILED,
                started_at=started,
                finished_at=finished,
                error="ValueError: boom",
            )
            await release(b, failed, unlock=False)
            await release(a, record(later, "replica-a", Outcome.MISSED), unlock=False)
            assert await a.record_unclaimed(
                [RunRecord("report", tick(4), Outcome.MISSED, "replica-b", None, None, None, None)]
            ) == [True]

            # The run keeps the database's start time; the queued one takes the record's.
            assert row(run.run_id) == (
                "replica-a",
                "succeeded",
                None,
                False,
                True,
                True,
                None,
                finished,
            )
            assert row(queued.run_id) == (
                "replica-b",
                "failed",
                "ValueError: boom",
                False,
                False,
                True,
                None,
                finished,
            )
            # No finish time given: the database's clock.
            [(outcome, no_start, finished_late)] = sql(
                dsn,
                "SELECT outcome, started_at IS NULL, finished_at >= claimed_at"
                " FROM replicron_runs WHERE run_id = %s",
                [later.run_id],
            )
            assert (outcome, no_start, finished_late) == ("missed", True, True)
            # record_unclaimed rows belong to the replica that wrote them.
            [missed] = sql(
                dsn,
                "SELECT replica_id, outcome, started_at IS NULL, heartbeat_at IS NULL,"
                " finished_at IS NOT NULL FROM replicron_runs WHERE scheduled_at = %s",
                [tick(4)],
            )
            assert tuple(missed) == ("replica-a", "missed", True, True, True)
            # Run ids are the ledger's.
            assert sql(dsn, "SELECT run_id FROM replicron_runs ORDER BY scheduled_at")[:3] == [
                (run.run_id,),
                (queued.run_id,),
                (later.run_id,),
            ]

    asyncio.run(main())


# ---- close ------------------------------------------------------------------------------


def test_close_leaves_no_advisory_lock(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a") as a, opened(dsn, "replica-b") as b:
            pid_a, pid_b = session_pid(dsn, "replica-a"), session_pid(dsn, "replica-b")
            by_claim = await claim(a, "cleanup", 1, lock=True)
            queued = await claim(a, "report", 1, lock=False)
            assert await a.lock(queued) is True
            kept = await claim(a, "job-42", 1, lock=True)
            await release(a, record(kept, "replica-a", Outcome.TIMED_OUT), unlock=False)
            other = await claim(b, "nightly-report", 1, lock=True)
            assert [by_claim.locked, kept.locked, other.locked] == [True, True, True]
            assert held_keys(dsn) == {
                job_lock_key("cleanup"): pid_a,
                job_lock_key("report"): pid_a,
                job_lock_key("job-42"): pid_a,
                job_lock_key("nightly-report"): pid_b,
            }
            await a.close()
            assert held_keys(dsn) == {job_lock_key("nightly-report"): pid_b}
            await b.close()
            assert advisory_locks(dsn) == []

    asyncio.run(main())
    assert advisory_locks(dsn) == []


# ---- heartbeats, staleness, the janitor -------------------------------------------------


def test_heartbeat_refreshes_the_open_rows_of_the_replica(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a") as a, opened(dsn, "replica-b") as b:
            mine = [
                await claim(a, "cleanup", 1, lock=True),
                await claim(a, "report", 1, lock=False),
            ]
            done = await claim(a, "sync", 1, lock=False)
            await release(a, record(done, "replica-a"), unlock=False)
            theirs = await claim(b, "report", 2, lock=False)
            sql(dsn, "UPDATE replicron_runs SET heartbeat_at = now() - interval '1 day'")
            await a._housekeeper.heartbeat()
            fresh = sql(
                dsn,
                "SELECT run_id, heartbeat_at > now() - interval '1 hour' FROM replicron_runs"
                " WHERE heartbeat_at IS NOT NULL ORDER BY run_id",
            )
            assert fresh == [
                (mine[0].run_id, True),
                (mine[1].run_id, True),
                (done.run_id, False),  # finished rows are not touched ...
                (theirs.run_id, False),  # ... nor another replica's
            ]

    asyncio.run(main())


def test_janitor_abandons_open_ticks_whose_heartbeat_is_stale(dsn: str) -> None:
    abandon = queries()["abandon_stale"]

    def run_janitor_query(namespace: str = "") -> list[Any]:
        return sql(dsn, abandon, {"namespace": namespace, "stale_after": timedelta(hours=2)})

    async def main() -> None:
        async with opened(dsn, "replica-a", stale_after=7200) as a:
            running = await claim(a, "cleanup", 1, lock=True)
            waiting = await claim(a, "report", 1, lock=False)
            done = await claim(a, "sync", 1, lock=False)
            await release(a, record(done, "replica-a"), unlock=False)
            sql(
                dsn,
                "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id,"
                " heartbeat_at, started_at) VALUES ('billing/', 'cleanup', %s, 'replica-x',"
                " now() - interval '1 day', now() - interval '1 day')",
                [tick(1)],
            )
            assert run_janitor_query() == []  # every open tick of ours is fresh

            sql(
                dsn,
                "UPDATE replicron_runs SET heartbeat_at = now() - interval '3 hours'"
                " WHERE run_id = ANY(%s)",
                [[running.run_id, done.run_id]],
            )
            # cleanup's lock is still held by the session that claimed it: a frozen replica,
            # whose run may go on, is not a dead one.
            assert run_janitor_query() == []
            [(terminated,)] = sql(
                dsn, "SELECT pg_terminate_backend(%s, 10000)", [session_pid(dsn, "replica-a")]
            )
            assert terminated is True
            assert run_janitor_query() == [("cleanup", tick(1), "replica-a")]
            assert run_janitor_query() == []  # recorded once

            # The backend's janitor runs the same query with its own stale_after (2 hours).
            sql(
                dsn,
                "UPDATE replicron_runs SET heartbeat_at = now() - interval '2 hours 1 minute'"
                " WHERE run_id = %s",
                [waiting.run_id],
            )
            await a._housekeeper.janitor()
            rows = sql(
                dsn,
                "SELECT namespace, job, outcome, error, finished_at IS NOT NULL"
                " FROM replicron_runs ORDER BY namespace, job",
            )
            assert rows == [
                ("", "cleanup", "abandoned", "replica replica-a stopped heartbeating", True),
                ("", "report", "abandoned", "replica replica-a stopped heartbeating", True),
                ("", "sync", "succeeded", None, True),
                ("billing/", "cleanup", None, None, False),  # another namespace: not ours
            ]
            assert run_janitor_query("billing/") == [("cleanup", tick(1), "replica-x")]

    asyncio.run(main())


def test_a_written_off_run_ends_where_its_lease_ended_not_when_the_janitor_came(
    dsn: str,
) -> None:
    """A run's holder stops it within stale_after of its last heartbeat, and no other run of
    the job may start before then: the janitor, however late it comes, stamps that instant
    (as row lease stamps lease_until), so the ledger never shows a takeover overlapping it."""

    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=20, stale_after=60) as a:
            lost = await claim(a, "cleanup", 1, lock=True)
            sql(dsn, "SELECT pg_terminate_backend(%s, 10000)", [session_pid(dsn, "replica-a")])
            sql(
                dsn,
                "UPDATE replicron_runs SET heartbeat_at = now() - interval '10 minutes'"
                " WHERE run_id = %s",
                [lost.run_id],
            )
            async with opened(dsn, "replica-b", heartbeat_interval=20, stale_after=60) as b:
                await b._housekeeper.janitor()
            [(outcome, finished, lease_end)] = sql(
                dsn,
                "SELECT outcome, finished_at, heartbeat_at + interval '60 seconds'"
                " FROM replicron_runs WHERE run_id = %s",
                [lost.run_id],
            )
            assert (outcome, finished) == ("abandoned", lease_end)

    asyncio.run(main())


def test_a_running_row_with_a_fresh_heartbeat_blocks_the_lock(dsn: str) -> None:
    """A run whose replica lost its lock may still be going: its row keeps the job closed
    although the advisory lock is free, until the row is finished or goes stale."""

    def insert_running(namespace: str, heartbeat_age: str) -> None:
        sql(
            dsn,
            "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id, heartbeat_at,"
            " started_at) VALUES (%s, 'cleanup', %s, 'replica-gone', now() - %s::interval,"
            " now() - interval '1 day')",
            [namespace, tick(1), heartbeat_age],
        )

    async def main() -> None:
        async with opened(dsn, "replica-b") as b:  # stale_after: 3 hours
            insert_running("", "1 minute")
            insert_running("billing/", "0 seconds")  # another namespace does not count
            assert advisory_locks(dsn) == []
            blocked = await claim(b, "cleanup", 2, lock=True)
            assert (blocked.status, blocked.locked) == (LOCKED, False)
            await release(b, record(blocked, "replica-b", Outcome.SKIPPED_OVERLAP), unlock=False)
            queued = await claim(b, "cleanup", 3, lock=False)
            assert queued.status is CLAIMED  # claims without the lock are not held back
            assert await b.lock(queued) is False
            assert advisory_locks(dsn) == []  # the try-locks were undone

            sql(
                dsn,
                "UPDATE replicron_runs SET heartbeat_at = now() - interval '3 hours 1 minute'"
                " WHERE replica_id = 'replica-gone' AND namespace = ''",
            )
            assert await b.lock(queued) is True
            await release(b, record(queued, "replica-b"), unlock=True)
            resumed = await claim(b, "cleanup", 4, lock=True)
            assert (resumed.status, resumed.locked) == (CLAIMED, True)

    asyncio.run(main())


@pytest.mark.parametrize("ending", ["recorded", "stale"])
def test_a_run_that_lost_its_session_keeps_the_job_closed_until_it_ends(
    dsn: str, ending: str
) -> None:
    async def main() -> None:
        lost: list[int] = []
        async with opened(dsn, "replica-a", lost) as a, opened(dsn, "replica-b") as b:
            run = await claim(a, "cleanup", 1, lock=True)
            assert run.status is CLAIMED
            [(terminated,)] = sql(
                dsn, "SELECT pg_terminate_backend(%s, 10000)", [session_pid(dsn, "replica-a")]
            )
            assert terminated is True  # and gone: the timeout waits for the process to exit
            assert advisory_locks(dsn) == []  # the lock died with the session

            # Its run may still be going: b may not start the job.
            blocked = await claim(b, "cleanup", 2, lock=True)
            assert blocked.status is LOCKED
            await release(b, record(blocked, "replica-b", Outcome.SKIPPED_OVERLAP), unlock=False)

            # a finds out at its next statement, which it retries on a new session; its
            # run's lock is reported lost.
            assert await a.last_ticks(["cleanup"]) == {"cleanup": tick(2)}
            assert lost == [run.run_id]

            if ending == "recorded":  # a reconnects and records the run abandoned
                abandoned = record(run, "replica-a", Outcome.ABANDONED, error="lock lost")
                await release(a, abandoned, unlock=True)
                assert advisory_locks(dsn) == []  # a's new session took no lock
            else:  # a never comes back: its heartbeat goes stale
                sql(
                    dsn,
                    "UPDATE replicron_runs SET heartbeat_at = now() - interval '1 day'"
                    " WHERE run_id = %s",
                    [run.run_id],
                )
            resumed = await claim(b, "cleanup", 3, lock=True)
            assert (resumed.status, resumed.locked) == (CLAIMED, True)

    asyncio.run(main())
