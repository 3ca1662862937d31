"""catch_up="all" on PostgreSQL: a replica killed (kill -9) while it works through a catch-up
backlog has claimed every tick of the backlog already, so each one has its row; once the
replica is seen gone, a janitor ends the rows it never finished abandoned, in both
coordination modes. Nothing of the gap is left without a record."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from replicron.backends.base import ClaimRequest
from replicron.postgres import CoordinationMode
from tests.helpers import poll_until
from tests.postgres.test_postgres_backend import advisory_locks, opened, record, release, sql

SECOND = timedelta(seconds=1)
GAP = timedelta(minutes=10)

#: A replica with the defaults a user gets, catching up a per-second job with
#: ``catch_up="all"`` on a clock standing at the end of the gap; its backlog's first run
#: says so and never ends.
REPLICA = """
import sys, time
from datetime import datetime
from replicron import Scheduler, every
from replicron.postgres import PostgresBackend
from replicron.testing import FakeClock

dsn, coordination, now = sys.argv[1], sys.argv[2], datetime.fromisoformat(sys.argv[3])


def first_of_the_backlog() -> None:
    print("started", flush=True)
    time.sleep(60)


backend = PostgresBackend(dsn, coordination=coordination)
scheduler = Scheduler(clock=FakeClock(now), backend=backend)
scheduler.add_job(every(seconds=1), first_of_the_backlog, name="fast", catch_up="all")
scheduler.start()
time.sleep(60)
"""


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_replica_killed_mid_backlog_leaves_every_tick_a_row_the_janitor_ends(
    dsn: str, coordination: CoordinationMode
) -> None:
    first_tick = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)

    async def the_job_ran_once() -> None:
        async with opened(dsn, "earlier", coordination=coordination) as earlier:
            [won] = await earlier.claim([ClaimRequest("fast", first_tick, True)])
            await release(earlier, record(won, "earlier"), unlock=True)

    asyncio.run(the_job_ran_once())
    end = first_tick + GAP
    with subprocess.Popen(
        [sys.executable, "-c", REPLICA, dsn, coordination, end.isoformat()],
        stdout=subprocess.PIPE,
        text=True,
    ) as replica:
        try:
            assert replica.stdout is not None
            assert replica.stdout.readline() == "started\n"
        finally:
            replica.kill()
    poll_until("the killed replica's server session to end", lambda: not advisory_locks(dsn), 10)
    # Time passes: the killed replica's heartbeats and row leases run out.
    sql(
        dsn,
        "UPDATE replicron_runs SET heartbeat_at = now() - interval '1 day',"
        " lease_until = now() - interval '1 second' WHERE outcome IS NULL",
    )

    async def janitor_pass() -> None:
        async with opened(dsn, "janitor", coordination=coordination) as janitor:
            await janitor._housekeeper.janitor()

    asyncio.run(janitor_pass())
    rows = sql(dsn, "SELECT scheduled_at, outcome FROM replicron_runs WHERE job = 'fast'")
    per_tick = Counter(tick for tick, _ in rows)
    gap = [first_tick + k * SECOND for k in range(GAP // SECOND + 1)]
    assert [tick for tick in gap if per_tick[tick] != 1] == []
    outcomes = Counter(outcome for tick, outcome in rows if tick > first_tick)
    assert outcomes == {"abandoned": GAP // SECOND}
