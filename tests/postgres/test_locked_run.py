"""locked_run / alocked_run: the standalone building block on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import psycopg_pool
import pytest

from replicron import job_lock_key
from replicron.postgres import LockedRun, alocked_run, locked_run


def held_keys(dsn: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks"
            " WHERE locktype = 'advisory' AND objsubid = 1 AND database = ("
            "   SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return {k - (1 << 64) if k >= 1 << 63 else k for (k,) in rows}


def test_five_concurrent_callers_one_runs(dsn: str) -> None:
    async def main() -> list[LockedRun]:
        inside = asyncio.Event()
        release = asyncio.Event()

        async def job() -> str:
            inside.set()
            await release.wait()
            return "done"

        first = asyncio.create_task(alocked_run(dsn, "report", job))
        await inside.wait()
        others = [await alocked_run(dsn, "report", job) for _ in range(4)]
        release.set()
        return [await first, *others]

    results = asyncio.run(main())
    assert [r.ran for r in results].count(True) == 1
    assert [r.ran for r in results].count(False) == 4
    assert results[0] == LockedRun(True, "done")
    # The lock was released: a later call runs again.
    assert asyncio.run(alocked_run(dsn, "report", lambda: 42)) == LockedRun(True, 42)
    assert held_keys(dsn) == set()


def test_sync_flavour_with_threads_and_a_pool(dsn: str) -> None:
    inside, release = threading.Event(), threading.Event()
    results: list[LockedRun] = []

    def job() -> str:
        inside.set()
        release.wait(10)
        return "ran"

    with psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=5, open=True) as pool:
        holder = threading.Thread(target=lambda: results.append(locked_run(pool, "sync", job)))
        holder.start()
        assert inside.wait(10)
        others = [locked_run(pool, "sync", job) for _ in range(4)]
        release.set()
        holder.join(10)
        assert [r.ran for r in others] == [False] * 4
        assert results == [LockedRun(True, "ran")]
        assert locked_run(pool, "sync", lambda: 1) == LockedRun(True, 1)
    assert held_keys(dsn) == set()


def test_unlock_after_an_exception_and_on_a_given_connection(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:

        def boom() -> None:
            assert job_lock_key("boom") in held_keys(dsn)
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            locked_run(conn, "boom", boom)
        assert held_keys(dsn) == set()
        assert not conn.closed  # a connection the caller gave stays open


def test_unlock_even_when_the_caller_is_cancelled(dsn: str) -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(alocked_run(dsn, "cancelled", forever))
        await started.wait()
        assert job_lock_key("cancelled") in held_keys(dsn)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert held_keys(dsn) == set()
        assert (await alocked_run(dsn, "cancelled", lambda: "again")).ran

    asyncio.run(main())


def test_keys_above_2_63_are_sent_signed(dsn: str) -> None:
    # "cleanup" hashes to 12418740963103222451 unsigned, which only fits bigint signed.
    seen: list[Any] = []
    assert locked_run(dsn, "cleanup", lambda: seen.append(held_keys(dsn))).ran
    assert seen == [{-6028003110606329165}]


def test_rejects_an_unknown_source() -> None:
    with pytest.raises(TypeError, match="expected a DSN"):
        locked_run(42, "x", lambda: None)  # type: ignore[arg-type]


@pytest.mark.parametrize("autocommit", [False, True])
def test_threads_sharing_one_connection_exclude_each_other(dsn: str, autocommit: bool) -> None:
    others_done = threading.Event()
    results: list[LockedRun] = []
    with psycopg.connect(dsn, autocommit=autocommit) as conn:

        def work() -> str:
            assert others_done.wait(10)  # holds the lock until every other caller has tried
            return "ran"

        def call() -> None:
            results.append(locked_run(conn, "shared", work))
            if sum(1 for r in results if not r.ran) == 4:
                others_done.set()

        threads = [threading.Thread(target=call) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert sorted(r.ran for r in results) == [False, False, False, False, True]
        # Left as found: idle (no transaction left open), and the lock released.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert held_keys(dsn) == set()


def test_a_transaction_of_the_callers_stays_open(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")  # the caller's own transaction, open
        assert locked_run(conn, "in-tx", lambda: 42) == LockedRun(True, 42)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
    assert held_keys(dsn) == set()


def test_tasks_sharing_one_async_connection_exclude_each_other(dsn: str) -> None:
    async def main() -> list[LockedRun]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            release = asyncio.Event()

            async def work() -> str:
                await release.wait()
                return "ran"

            calls = [asyncio.create_task(alocked_run(conn, "shared", work)) for _ in range(5)]
            while sum(call.done() for call in calls) < 4:  # the four that found it held
                await asyncio.sleep(0)
            release.set()
            results = [await c for c in calls]
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            return results

    results = asyncio.run(main())
    assert sorted(r.ran for r in results) == [False, False, False, False, True]
    assert held_keys(dsn) == set()
