"""A replica that stops claiming leaves at once: gone for the others' peers, kept gone by
the heartbeats of its last runs, and told which replicas stay, read after its own leaving
committed, so that of replicas leaving together at least one sees itself the last."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from replicron.postgres import PostgresBackend
from tests.postgres.test_postgres_backend import opened

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
