"""A fixed-delay job (``after``) whose running replica is killed with SIGKILL mid-run, on
PostgreSQL in both coordination modes: the killed run's row is written off as abandoned
with a finish time, and the chain goes on from it on another replica (the next tick is that
finish plus the delay), with no tick run twice and no two runs at once."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.faults.analysis import LedgerRow
from tests.faults.cluster import Database
from tests.faults.fleet import Fleet, both_modes

Summary = Callable[[str], None]
HEARTBEAT, STALE = 0.5, 1.5  # the replicas' heartbeat_interval and stale_after
DELAY, TASK_MS = 2.0, 3000
JOB = "job-0"
#: A dead replica's runs are written off once stale, by a janitor that comes by every twelfth
#: heartbeat; then the next tick is a delay later (at most), and another replica's read of
#: the ledger and claim take a moment on a loaded machine.
GAP_BOUND = STALE + 12 * HEARTBEAT + DELAY + 5.0


def starts(replicas: Fleet) -> list[dict[str, Any]]:
    return sorted(replicas.events("start"), key=lambda e: float(e["mono"]))


def overlaps(replicas: Fleet) -> int:
    """Pairs of runs that were going on at once (a killed process's run until it died)."""
    finishes = {(e["pid"], e["run_id"]): float(e["mono"]) for e in replicas.events("finish")}
    ends = replicas.replica_ends()
    spans = sorted(
        (float(e["mono"]), finishes.get((e["pid"], e["run_id"]), ends.get(e["pid"], 1e18)))
        for e in replicas.events("start")
    )
    return sum(1 for i, (_, end) in enumerate(spans) for start, _ in spans[i + 1 :] if start < end)


def chain_of(db: Database) -> list[LedgerRow]:
    return sorted((r for r in db.ledger() if r.job == JOB), key=lambda r: r.scheduled_at)


@both_modes
@pytest.mark.timeout(180)
def test_kill_9_of_the_replica_running_a_fixed_delay_job(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    for replica in ("r1", "r2", "r3"):
        replicas.start(replica, jobs=1, every_s=DELAY, task_ms=TASK_MS, fixed_delay=True)
    replicas.wait_ready(["r1", "r2", "r3"])
    # The second link is under way: kill its replica a second into the run.
    victim = replicas.wait_until("a second run", lambda: starts(replicas)[1:2] or None, 40)[0]
    time.sleep(max(0.0, float(victim["mono"]) + 1.0 - time.monotonic()))
    victim_replica = replicas.name_of(victim["pid"])
    replicas.kill(victim_replica)
    killed_at = time.monotonic()

    def runs_after_the_kill() -> list[dict[str, Any]] | None:
        later = [e for e in starts(replicas) if float(e["mono"]) > killed_at]
        return later if len(later) >= 2 else None  # the chain goes on, and on again

    later = replicas.wait_until("two runs after the kill", runs_after_the_kill, 2 * GAP_BOUND)
    codes = replicas.stop()
    leaked = replicas.leaked_locks()
    chain = chain_of(db)
    ran = Counter(e["tick"] for e in replicas.events("start"))
    duplicates = sum(n - 1 for n in ran.values())
    pairs = overlaps(replicas)
    [killed] = [row for row in chain if row.run_id == victim["run_id"]]
    following = chain[chain.index(killed) + 1]
    links = {
        (b.scheduled_at - a.finished_at).total_seconds()
        for a, b in itertools.pairwise(chain)
        if a.finished_at is not None
    }
    gap = float(later[0]["mono"]) - killed_at
    assert killed.finished_at is not None
    summary(
        f"[kill -9 of the replica running a fixed-delay job ({DELAY:g} s delay, "
        f"{TASK_MS / 1000:g} s task, stale_after {STALE} s)] runs={sum(ran.values())} "
        f"duplicates={duplicates} overlaps={pairs} leaked locks={len(leaked)} | next run "
        f"{gap:.2f} s after the kill, on {later[0]['replica']}; killed row {killed.outcome!r} "
        f"finished {(killed.finished_at - killed.scheduled_at).total_seconds():.2f} s "
        f"after its tick; chain links={sorted(links)} s; ledger outcomes="
        f"{dict(Counter(row.outcome for row in chain))} exit={codes}"
    )
    assert duplicates == 0
    assert pairs == 0
    assert leaked == []
    assert killed.outcome == "abandoned"
    assert later[0]["replica"] != victim_replica
    assert (following.scheduled_at - killed.finished_at).total_seconds() == DELAY
    assert links == {DELAY}, chain
    assert all(row.outcome is not None for row in chain), chain
    assert gap < GAP_BOUND


def between_runs(replicas: Fleet) -> dict[str, Any] | None:
    """The latest run's start, once it finished and no later run started."""
    started = starts(replicas)
    if len(started) < 2:
        return None
    latest = started[-1]
    finished = {(e["pid"], e["run_id"]) for e in replicas.events("finish")}
    return latest if (latest["pid"], latest["run_id"]) in finished else None


@both_modes
@pytest.mark.timeout(180)
def test_kill_9_of_the_leader_between_runs_of_a_fixed_delay_leader_mode_job(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    """The leader dies between two runs: its lease (3.5 s) outlives the next tick (1 s after
    the finish), which the standbys leave to it; the replica that takes over runs that tick
    and the chain goes on."""
    delay, stale = 1.0, 4.0
    for replica in ("r1", "r2", "r3"):
        replicas.start(
            replica,
            jobs=1,
            every_s=delay,
            task_ms=50,
            fixed_delay=True,
            leader=True,
            heartbeat_interval=HEARTBEAT,
            stale_after=stale,
        )
    replicas.wait_ready(["r1", "r2", "r3"], timeout=60)
    last_run = replicas.wait_until(
        "a run over, the next not started", lambda: between_runs(replicas), 40
    )
    leader = replicas.name_of(last_run["pid"])
    replicas.kill(leader)
    killed_at = time.monotonic()
    assert between_runs(replicas) == last_run  # no run was going on at the kill

    def runs_after_the_kill() -> list[dict[str, Any]] | None:
        later = [e for e in starts(replicas) if float(e["mono"]) > killed_at]
        return later if len(later) >= 3 else None

    later = replicas.wait_until("three runs after the kill", runs_after_the_kill, 60)
    codes = replicas.stop()
    chain = chain_of(db)
    ran = Counter(e["tick"] for e in replicas.events("start"))
    duplicates = sum(n - 1 for n in ran.values())
    gap = float(later[0]["mono"]) - killed_at
    summary(
        f"[kill -9 of the leader between runs of a fixed-delay leader-mode job ({delay:g} s "
        f"delay, stale_after {stale:g} s)] runs={sum(ran.values())} duplicates={duplicates} "
        f"overlaps={overlaps(replicas)} | next run {gap:.2f} s after the kill, on "
        f"{later[0]['replica']}; ledger outcomes={dict(Counter(r.outcome for r in chain))} "
        f"exit={codes}"
    )
    assert duplicates == 0
    assert overlaps(replicas) == 0
    assert {e["replica"] for e in later} != {leader}
    assert all(row.outcome is not None for row in chain), chain
    assert gap < stale + delay + 10.0
