"""A replica that stops claiming leaves at once: gone for the others' peers, kept gone by
the heartbeats of its last runs, and told which replicas stay, read after its own leaving
committed, so that of replicas leaving together at least one sees itself the last."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from replicron import Scheduler, every
from replicron._engine.membership import LEAVE_WITHIN
from replicron.postgres import PostgresBackend
from replicron.testing import FakeClock
from tests.helpers import Recorder, z
from tests.postgres.test_postgres_backend import opened

START = z(2026, 1, 1)

MODES = pytest.mark.parametrize("coordination", ["advisory", "lease"])


@MODES
def test_a_leaving_replica_is_gone_for_the_others_and_learns_who_stays(
    dsn: str, coordination: str
) -> None:
    async def main() -> None:
        options: dict[str, Any] = {"coordination": coordination}
        async with (
            opened(dsn, "a", **options) as a,
            opened(dsn, "b", **options) as b,
            opened(dsn, "c", **options) as c,
        ):
            await a._housekeeper.heartbeat()
            assert a.peers == {"a", "b", "c"}
            assert (await c.leave()).keys() == {"a", "b"}
            await c._housekeeper.heartbeat()  # its last runs' heartbeats keep it gone
            await a._housekeeper.heartbeat()
            assert a.peers == {"a", "b"}
            assert (await b.leave()).keys() == {"a"}
            assert await a.leave() == {}  # the last one: it records what is left

    asyncio.run(main())


@MODES
def test_of_replicas_leaving_together_at_least_one_sees_itself_the_last(
    dsn: str, coordination: str
) -> None:
    async def main() -> None:
        options: dict[str, Any] = {"coordination": coordination}
        for _ in range(10):
            async with opened(dsn, "a", **options) as a, opened(dsn, "b", **options) as b:
                staying = await asyncio.gather(a.leave(), b.leave())
                assert {} in staying, staying

    asyncio.run(main())


@MODES
def test_a_replica_id_used_again_is_back_among_the_peers(dsn: str, coordination: str) -> None:
    async def main() -> None:
        options: dict[str, Any] = {"coordination": coordination}
        async with opened(dsn, "a", **options) as a:
            async with opened(dsn, "b", **options) as b:
                await b.leave()
            async with opened(dsn, "b", **options) as b_again:
                await b_again._housekeeper.heartbeat()
                await a._housekeeper.heartbeat()
                assert a.peers == {"a", "b"}

    asyncio.run(main())


@MODES
def test_the_replicas_that_stay_come_with_the_instant_they_plan_from(
    dsn: str, coordination: str
) -> None:
    """A replica holds the ticks it planned: one that joined after a tick does not have it,
    so a leaving replica must not hand that tick to it."""

    async def main() -> None:
        options: dict[str, Any] = {"coordination": coordination}
        early = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        async with opened(dsn, "a", **options) as a, opened(dsn, "b", **options) as b:
            await a.join(early)
            await b.join(early + timedelta(seconds=30))
            staying = await b.leave()
            assert staying == {"a": early}
            assert (await a.leave()) == {}

    asyncio.run(main())


@MODES
def test_a_backend_opened_again_after_leaving_is_among_the_peers(
    dsn: str, coordination: str
) -> None:
    async def main() -> None:
        options: dict[str, Any] = {"coordination": coordination, "heartbeat_interval": 3600}
        async with opened(dsn, "a", **options) as a:
            b = PostgresBackend(dsn, **options)
            await b.open("b", None)
            await b.leave()
            await b.close()
            await b.open("b", None)  # the same object: a scheduler started again
            try:
                await b._housekeeper.heartbeat()
                await a._housekeeper.heartbeat()
                assert a.peers == {"a", "b"}
            finally:
                await b.close()

    asyncio.run(main())


def test_a_slow_leave_does_not_cut_the_lock_session_under_a_run(dsn: str) -> None:
    """Telling the others takes longer than a stopping replica waits for it (the row is
    locked by another transaction): the statement goes on rather than being cancelled, which
    would take the lock session, and with it the lock of the run going on."""
    clock = FakeClock(START)
    recorder = Recorder()
    started, go = threading.Event(), threading.Event()

    def task() -> None:
        started.set()
        assert go.wait(30)

    # Statements may take 5 s here: the leave's bound, not the server's, is what is passed.
    backend = PostgresBackend(dsn, heartbeat_interval=2, stale_after=12)
    scheduler = Scheduler(clock=clock, backend=backend, replica_id="slow", listeners=[recorder])
    scheduler.add_job(every(seconds=10), task, name="report")
    scheduler.start()
    clock.set(START + timedelta(seconds=10))
    assert started.wait(10)
    with psycopg.connect(dsn) as blocker:
        blocker.execute("SELECT 1 FROM replicron_replicas WHERE replica_id = 'slow' FOR UPDATE")
        stopping = threading.Thread(target=scheduler.shutdown, kwargs={"timeout": 20})
        stopping.start()
        time.sleep(LEAVE_WITHIN + 1)  # the leave waits on the row past its bound
        blocker.rollback()
    go.set()
    stopping.join(30)
    assert not stopping.is_alive()
    assert recorder.of("on_lock_error") == []
    assert [e.job for e in recorder.of("after_success")] == ["report"]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT outcome FROM replicron_runs WHERE job = 'report'").fetchall()
    assert rows == [("succeeded",)]
