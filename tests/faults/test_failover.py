"""A failover of the primary while three replicas run per-second jobs: the primary crashes
(``stop -m immediate``), its standby is promoted, and the replicas follow it through their
multi-host DSN (``target_session_attrs=read-write``).

With a synchronous standby nothing the replicas were told is committed can be lost: no tick
runs twice, no runs overlap, and every tick gets its row. With an asynchronous standby that
is behind, the last claims and outcomes are lost with the old primary; each replica notices
the new server (one ERROR per failover), stops its held runs and puts back the rows it wrote
that the new server lacks, and a tick that ran on both sides of the failover is said at ERROR.
The figures (duplicates, ticks without a row, rows put back, time to the first run after the
promotion) go to the summary.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests._harness.reporting import report_on_failure
from tests.faults.analysis import Window
from tests.faults.fleet import Fleet, both_modes
from tests.faults.netns import NetworkNamespace
from tests.faults.pooler import PgBouncer, PoolMode
from tests.faults.prereqs import postgres_bin, require
from tests.faults.replication import FailoverDatabase, ReplicatedPair

Summary = Callable[[str], None]
REPLICAS = ("r1", "r2", "r3")
FAILOVERS = 2  # per test: the pair is rebuilt in between
BEHIND_S = 1.5  # how far the asynchronous standby is behind when the primary dies
CHANGED = "the server changed under this replica"
PUT_BACK = re.compile(r"the new server lacked (\d+) \(put back\) and the outcome of (\d+)")
TWICE = re.compile(r"job '([^']+)' tick (\S+) ran here as run .* it may have run twice")


@pytest.fixture(params=[True, False], ids=["sync", "async"])
def pair(request: pytest.FixtureRequest, suite_dir: Path) -> Iterator[ReplicatedPair]:
    require("pg_basebackup")
    bindir = postgres_bin()
    assert bindir is not None
    pair = ReplicatedPair(suite_dir, bindir, synchronous=bool(request.param))
    report_on_failure(request, "primary and standby logs", pair.log_tails)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


@pytest.fixture
def fleet(
    request: pytest.FixtureRequest,
    pair: ReplicatedPair,
    netns: NetworkNamespace,
    tmp_path: Path,
    coordination: str,
) -> Iterator[Fleet]:
    def no_pgbouncer(mode: PoolMode) -> PgBouncer:
        raise AssertionError("no pgbouncer in front of a replicated pair")

    db = FailoverDatabase.create(pair)
    fleet = Fleet(db, tmp_path, netns=netns, pgbouncer=no_pgbouncer, coordination=coordination)
    report_on_failure(request, "replica logs", fleet.logs)
    try:
        yield fleet
    finally:
        fleet.close()
        db.close()


def first_start_after(fleet: Fleet, after: float, timeout: float = 20.0) -> float:
    """When the first run started after ``after`` (monotonic)."""

    def started() -> float | None:
        starts = [float(e["mono"]) for e in fleet.events("start") if float(e["mono"]) > after]
        return min(starts) if starts else None

    return fleet.wait_until("a run to start after the failover", started, timeout, every=0.02)


@both_modes
@pytest.mark.timeout(120)
def test_a_failover_of_the_primary(fleet: Fleet, pair: ReplicatedPair, summary: Summary) -> None:
    for replica_id in REPLICAS:
        fleet.start(replica_id, dsn=pair.dsn(fleet.db.name), jobs=4, every_s=1, task_ms=200)
    ready = fleet.wait_ready(REPLICAS)
    start = max(ready.values()) + 0.5
    identities = [pair.identity()]
    first_runs = []
    for n in range(FAILOVERS):
        if n:
            pair.rebuild()
        time.sleep(2.0)
        if not pair.synchronous:
            pair.fall_behind()
            time.sleep(BEHIND_S)
        promoted = pair.failover()
        first_runs.append(first_start_after(fleet, promoted) - promoted)
        identities.append(pair.identity())
        for replica_id in REPLICAS:  # each replica notices, once
            fleet[replica_id].wait_log(CHANGED, timeout=15, count=n + 1)
    time.sleep(2.5)
    window = Window.from_monotonic(start, time.monotonic() - 1.0)
    fleet.stop()
    analysis = fleet.analyse(window)

    logs = {replica_id: fleet[replica_id].log() for replica_id in REPLICAS}
    changes = {replica_id: log.count(CHANGED) for replica_id, log in logs.items()}
    found = [m for log in logs.values() for m in PUT_BACK.finditer(log)]
    put_back, outcomes = sum(int(m[1]) for m in found), sum(int(m[2]) for m in found)
    said_twice = {
        (job, datetime.fromisoformat(tick))
        for log in logs.values()
        for job, tick in TWICE.findall(log)
    }
    silent_twice = [run for run in analysis.duplicates if (run.job, run.tick) not in said_twice]
    ran = {(run.job, run.tick) for run in analysis.runs}
    rows = {(row.job, row.scheduled_at) for row in analysis.ledger}
    ran_without_row = sorted(tick for tick in ran if tick not in rows)
    kind = "sync" if pair.synchronous else f"async, standby {BEHIND_S} s behind"
    summary(
        f"[{FAILOVERS} failovers, {kind}] {analysis} | ran without a row="
        f"{len(ran_without_row)} rows lost and put back={put_back / FAILOVERS:.1f} "
        f"outcomes written again={outcomes / FAILOVERS:.1f} per failover; "
        f"first run after promotion="
        f"{', '.join(f'{s:.2f}' for s in first_runs)} s | server changes {changes}"
    )

    # Every server change was noticed by every replica, and said once.
    assert len(set(identities)) == FAILOVERS + 1, identities
    assert changes == dict.fromkeys(REPLICAS, FAILOVERS)
    assert not silent_twice, f"ran twice without a word: {[str(r) for r in silent_twice]}"
    assert not analysis.open_rows, analysis
    assert not analysis.leaked_locks, analysis
    assert not ran_without_row, ran_without_row
    if not pair.synchronous:
        assert put_back, "the standby was behind: some rows must have been lost"
    if pair.synchronous:
        # Nothing committed is lost: the promise holds as without a failover.
        assert not analysis.duplicates, analysis
        assert not analysis.overlaps, analysis
        assert not analysis.unrecorded, analysis
