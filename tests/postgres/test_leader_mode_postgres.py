"""Leader mode on a real server, in both coordination modes: the lease is a row taken by a
compare-and-set on the database's clock; a standby takes it over once it ran out; a leader
whose renewals fail (its connection hangs behind a proxy) stops counting itself leader before
the server's end of its lease, so before any standby may take over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from replicron.backends.leadership import Leader
from replicron.postgres import CoordinationMode, PostgresBackend
from tests.faults.proxy import HangingProxy
from tests.postgres.test_postgres_backend import opened, sql

MODES: list[CoordinationMode] = ["advisory", "lease"]
#: Short enough for a test, long enough for a loaded machine: the lease is 1.5 s.
HEARTBEAT, STALE_AFTER = 0.5, 2.0


async def until(condition: Callable[[], bool], within: float) -> float:
    """Poll ``condition`` every 5 ms; the monotonic instant it first held."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)
    return time.monotonic()


def lease_row(dsn: str) -> tuple[str, int, float]:
    """The holder, its epoch, and seconds left of its lease by the server's clock."""
    [(holder, epoch, left)] = sql(
        dsn,
        "SELECT holder, epoch, extract(epoch FROM expires_at - now())::float8"
        " FROM replicron_leaders WHERE namespace = ''",
    )
    return holder, epoch, left


@pytest.mark.parametrize("mode", MODES)
def test_one_contender_leads_and_a_standby_takes_over_once_the_lease_ran_out(
    dsn: str, mode: CoordinationMode
) -> None:
    async def main() -> None:
        options: dict[str, Any] = {
            "coordination": mode,
            "heartbeat_interval": HEARTBEAT,
            "stale_after": STALE_AFTER,
        }
        async with opened(dsn, "a", **options) as a, opened(dsn, "b", **options) as b:
            changed: list[str] = []
            a.contend(lambda: changed.append("a"))
            await until(a.leading, 5)
            b.contend(lambda: changed.append("b"))
            await asyncio.sleep(3 * HEARTBEAT)  # b's heartbeats find the lease held
            assert a.leading()
            assert not b.leading()
            assert b.leader == Leader("a", 1)
            holder, epoch, left = lease_row(dsn)
            assert (holder, epoch) == ("a", 1)
            assert 0 < left <= STALE_AFTER - HEARTBEAT  # the lease: stale_after - heartbeat
            # a's heartbeats stop (as if it froze): its lease runs out on the server's clock,
            # after its own count of it, and b takes over.
            await a._housekeeper.stop()
            await until(b.leading, STALE_AFTER + 5)
            assert not a.leading()
            assert lease_row(dsn)[:2] == ("b", 2)
            await a._housekeeper.heartbeat()  # a comes back: b leads
            assert not a.leading()
            assert a.leader == Leader("b", 2)
            assert changed.count("b") == 1

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_a_leader_cut_off_stops_leading_before_a_standby_may_take_over(
    dsn: str, mode: CoordinationMode
) -> None:
    params = conninfo_to_dict(dsn)
    proxy = HangingProxy((str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))))

    async def main() -> None:
        options: dict[str, Any] = {
            "coordination": mode,
            "heartbeat_interval": HEARTBEAT,
            "stale_after": STALE_AFTER,
            "statement_timeout": 0.5,
        }
        cut_off = make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
        async with opened(cut_off, "a", **options) as a, opened(dsn, "b", **options) as b:
            a.contend(lambda: None)
            await until(a.leading, 5)
            b.contend(lambda: None)
            await asyncio.sleep(2 * HEARTBEAT)
            assert not b.leading()
            hung = time.monotonic()
            proxy.hang()
            fenced = await until(lambda: not a.leading(), STALE_AFTER + 2)
            # a gave up while the lease was still its own: nobody had taken it over (a's end
            # is counted from before its renewal's send, the server's from its now() after).
            assert lease_row(dsn)[0] == "a"
            assert not b.leading()
            took_over = await until(b.leading, STALE_AFTER + 5)
            assert fenced < took_over
            assert lease_row(dsn)[:2] == ("b", 2)
            print(f"{mode}: fenced {fenced - hung:.2f} s, taken over {took_over - hung:.2f} s")
            assert took_over - hung <= STALE_AFTER + 1.0  # + a heartbeat's slack on a busy host

    try:
        asyncio.run(main())
    finally:
        proxy.close()


def test_a_stopping_leader_hands_the_lease_on_at_once(dsn: str) -> None:
    async def main() -> None:
        options: dict[str, Any] = {"heartbeat_interval": HEARTBEAT, "stale_after": 7200}
        async with opened(dsn, "b", **options) as b:
            async with opened(dsn, "a", **options) as a:
                a.contend(lambda: None)
                await until(a.leading, 5)
                b.contend(lambda: None)
                await asyncio.sleep(2 * HEARTBEAT)
                assert not b.leading()
                assert (await b.cluster_status()).leader == "a"
                await a.leave()
                assert (await b.cluster_status()).leader is None
                assert not a.leading()
            # Its lease would have lasted two hours: it ended as a left.
            await until(b.leading, 3 * HEARTBEAT + 2)
            assert lease_row(dsn)[:2] == ("b", 2)
            assert (await b.cluster_status()).leader == "b"

    asyncio.run(main())


def test_the_lease_length_is_the_runs_lease() -> None:
    backend = PostgresBackend("postgresql://x@127.0.0.1/x", heartbeat_interval=5, stale_after=20)
    assert backend.lease == 15
    assert timedelta(seconds=backend.lease) == backend._housekeeper._leader_term


@pytest.mark.parametrize("mode", MODES)
def test_a_replica_that_does_not_contend_leaves_the_lease_alone(
    dsn: str, mode: CoordinationMode
) -> None:
    async def main() -> None:
        async with opened(dsn, "a", coordination=mode, heartbeat_interval=0.1) as a:
            await asyncio.sleep(0.5)  # heartbeats go by
            assert a.leader is None
            assert not a.leading()
        assert sql(dsn, "SELECT count(*) FROM replicron_leaders") == [(0,)]

    asyncio.run(main())
