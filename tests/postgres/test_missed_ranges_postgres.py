"""Two replicas catching up a two-hour gap of a per-second job at once, on real PostgreSQL in
both coordination modes: every tick of the gap has exactly one record (the older missed
ticks one range), the latest runs once, and `replicron status` counts every missed tick."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import psycopg
import pytest

from replicron import Scheduler, every
from replicron.postgres import CoordinationMode, PostgresBackend
from replicron.testing import FakeClock
from tests.helpers import Recorder, run_cli, step

SECOND = timedelta(seconds=1)
DOWN = timedelta(hours=2)


def covering(dsn: str, job: str) -> list[tuple[datetime, datetime, int, str | None]]:
    """Each row of ``job``: its first and last tick, how many ticks it stands for, outcome."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT scheduled_at, coalesce(scheduled_through, scheduled_at), ticks, outcome"
            " FROM replicron_runs WHERE job = %s ORDER BY scheduled_at",
            [job],
        ).fetchall()
    return [(first, last, ticks, outcome) for first, last, ticks, outcome in rows]


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_two_replicas_catching_up_one_gap_at_once_cover_each_tick_once(
    dsn: str, coordination: CoordinationMode
) -> None:
    # Some hours back, so that the database's clock finds every tick due and of the last day.
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - 3 * DOWN)
    first_tick = clock.now() + SECOND
    with Scheduler(clock=clock, backend=PostgresBackend(dsn, coordination=coordination)) as s:
        ran = Recorder()
        s.add_listener(ran)
        s.add_job(every(seconds=1), lambda: None, name="fast")
        step(clock, first_tick)
        ran.wait_count("after_success", 1)
    clock.set(first_tick + DOWN)

    recorder = Recorder()
    replicas = [
        Scheduler(
            clock=clock,
            backend=PostgresBackend(dsn, coordination=coordination),
            listeners=[recorder],
        )
        for _ in range(2)
    ]
    for replica in replicas:
        replica.add_job(every(seconds=1), lambda: None, name="fast")
    starters = [threading.Thread(target=replica.start) for replica in replicas]
    try:
        for starter in starters:
            starter.start()
        for starter in starters:
            starter.join()
        recorder.wait_count("after_success", 1)
        for replica in replicas:
            replica.wait_idle()
    finally:
        for replica in replicas:
            replica.shutdown(timeout=5)

    rows = covering(dsn, "fast")
    gap = [row for row in rows if row[0] > first_tick]
    # Each tick of the gap in exactly one record: consecutive, none overlapping, none left out.
    assert gap[0][0] == first_tick + SECOND
    assert gap[-1][1] == first_tick + DOWN
    assert all(a[1] + SECOND == b[0] for a, b in pairwise(gap))
    assert sum(ticks for _, _, ticks, _ in gap) == DOWN // SECOND
    assert [outcome for *_, outcome in gap] == ["missed"] * (len(gap) - 1) + ["succeeded"]
    assert len([row for row in gap if row[2] > 1]) == 1  # one range, whoever wrote it
    assert len(recorder.of("after_success")) == 1

    status = run_cli("status", "--database-url", dsn, "--json")
    assert status.returncode == 0, status.stderr
    [view] = json.loads(status.stdout)["jobs"]
    assert (view["job"], view["missed_24h"]) == ("fast", DOWN // SECOND - 1)
