"""Faults of the lock session and the server: a session terminated while an outcome is
written, every session terminated, the server restarted, the answers to a replica lost. After
each, the job is not wedged, no tick is lost without a row, nothing overlaps and no lock is
left held. (A session terminated while idle, the server down for seconds and lost answers in
row-lease mode are the simulator's: docs/protocol.md, section 10.)"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.faults.analysis import Analysis, Run, Window, monotonic_at
from tests.faults.cluster import Database, PgCluster
from tests.faults.fleet import Fleet, both_modes
from tests.faults.netns import NetworkNamespace

Summary = Callable[[str], None]


def outcomes(analysis: Analysis) -> dict[str, int]:
    return dict(Counter(str(row.outcome) for row in analysis.ledger))


def wait_run_start(replicas: Fleet, after: float, timeout: float = 15.0) -> dict[str, Any]:
    """The first run start after ``after`` (monotonic)."""

    def started() -> dict[str, Any] | None:
        found = [e for e in replicas.events("start") if float(e["mono"]) > after]
        return found[0] if found else None

    return replicas.wait_until("a run to start", started, timeout)


def finish(replicas: Fleet, start: float, end: float) -> tuple[Analysis, dict[str, int]]:
    """Let the last ticks of the window from ``start`` to ``end`` (monotonic) settle, stop
    every replica, check every invariant."""
    window = Window.from_monotonic(start, end)
    replicas.wait_window_end(window, after=2.5, timeout=60)
    codes = replicas.stop()
    analysis = replicas.assert_invariants(window)
    return analysis, codes


def runs_after(analysis: Analysis, mono: float) -> list[Run]:
    return [run for run in analysis.runs if run.start_mono > mono]


def kill_during_the_outcome_write(replicas: Fleet, db: Database, run: dict[str, Any]) -> bool:
    """Hold the row of ``run`` (its "start" event) with a lock that its outcome write waits
    for, and the heartbeats do not (FOR KEY SHARE); terminate the lock session of its replica
    once that statement waits, then let go: the session dies mid-write, never too late.
    False when the run's outcome was written before the row could be held."""
    replica_id = replicas.name_of(run["pid"])
    with psycopg.connect(db.dsn, application_name="faults holder") as holder:
        [(outcome,)] = holder.execute(
            "SELECT outcome FROM replicron_runs WHERE run_id = %s FOR KEY SHARE",
            (run["run_id"],),
        ).fetchall()
        if outcome is not None:
            return False

        def waiting() -> tuple[int, str] | None:
            rows = db.rows(
                "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s"
                " AND %s = ANY(pg_blocking_pids(pid))",
                (f"replicron {replica_id}", holder.info.backend_pid),
            )
            return (int(rows[0][0]), str(rows[0][1])) if rows else None

        pid, query = replicas.wait_until("the outcome write to wait", waiting, 10, every=0.01)
        finished = [e for e in replicas.events("finish") if e["run_id"] == run["run_id"]]
        assert finished, f"{replica_id} waited on the row of a run still going: {query}"
        [(terminated,)] = db.rows("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        assert terminated, f"the lock session {pid} of {replica_id} was not terminated"
        holder.rollback()
    replicas.wait_until(
        f"{replica_id} to write on a new lock session",
        lambda: db.lock_session_pid(replica_id) not in (None, pid),
        10,
    )
    return True


@both_modes
@pytest.mark.timeout(120)
def test_lock_session_terminated_while_the_outcome_is_written(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    """300 ms runs; three times, the outcome write of a run is held on its row and the lock
    session terminated while it waits: the job must keep running on some replica (it never
    wedged before the fix), and each outcome is written on a new session."""
    for replica_id in ("r1", "r2"):
        replicas.start(replica_id, jobs=1, every_s=1, task_ms=300)
    ready = replicas.wait_ready(["r1", "r2"])
    start = max(ready.values()) + 0.5
    seen, tried = start, 0
    hit: list[int] = []
    while len(hit) < 3:
        tried += 1
        assert tried <= 10, f"only {len(hit)} of {tried - 1} runs could be held in time"
        event = wait_run_start(replicas, seen)
        seen = float(event["mono"])
        if kill_during_the_outcome_write(replicas, db, event):
            hit.append(int(event["run_id"]))
    cut = time.monotonic()
    analysis, codes = finish(replicas, start, cut + 4)
    later = runs_after(analysis, cut + 1)
    written = {row.run_id: row.outcome for row in analysis.ledger if row.run_id in hit}
    summary(
        f"[failed release x3: the lock session killed while the outcome write waited, "
        f"{tried} runs tried] {analysis} | runs after the last kill={len(later)} "
        f"outcomes={outcomes(analysis)} exit={codes}"
    )
    assert written == dict.fromkeys(hit, "succeeded"), written
    assert len(later) >= 2, "the job stopped running after its outcome could not be written"


@pytest.mark.timeout(120)
def test_claims_whose_answers_are_lost_leave_no_open_row(
    replicas: Fleet, netns: NetworkNamespace, summary: Summary
) -> None:
    """One replica; from just before a tick, the server's answers to it are dropped for 6 s
    (its requests still arrive and commit). Claims it made but never heard back about must
    end recorded, and the job must not stay blocked by them."""
    replicas.start("r1", jobs=2, every_s=1, task_ms=100, in_namespace=True)
    ready = replicas.wait_ready(["r1"])
    start = ready["r1"] + 0.5
    time.sleep(max(0.0, _next_whole_second_mono() - 0.03 - time.monotonic()))
    netns.partition(answers_only=True)
    cut = time.monotonic()
    time.sleep(6)
    netns.heal()
    healed = time.monotonic()
    analysis, codes = finish(replicas, start, healed + 4)
    after = runs_after(analysis, healed + 2)
    lost = [row for row in analysis.ledger if row.error and "answer was lost" in row.error]
    summary(
        f"[answers to r1 lost for {healed - cut:.1f} s from a tick, one replica] {analysis} | "
        f"runs from 2 s after the heal={len(after)} lost claims recorded={len(lost)} "
        f"outcomes={outcomes(analysis)} exit={codes}"
    )
    assert len(after) >= 2 * 2, "the jobs did not run again after the answers came back"


def _next_whole_second_mono() -> float:
    now = time.time()
    return time.monotonic() + (int(now) + 1 - now)


@both_modes
@pytest.mark.timeout(150)
@pytest.mark.parametrize("fault", ["terminate all sessions", "server restart"])
def test_server_faults_leave_every_tick_recorded(
    replicas: Fleet, db: Database, pg: PgCluster, summary: Summary, fault: str
) -> None:
    for replica_id in ("r1", "r2", "r3"):
        replicas.start(replica_id, jobs=3, every_s=1, task_ms=400)
    ready = replicas.wait_ready(["r1", "r2", "r3"])
    start = max(ready.values()) + 0.5
    time.sleep(max(0.0, start + 2.3 - time.monotonic()))
    hit = time.monotonic()
    if fault == "terminate all sessions":
        db.terminate_all()
    else:
        pg.restart()
    back = time.monotonic()
    analysis, codes = finish(replicas, start, back + 4)
    after = runs_after(analysis, back + 1.5)
    missed = sum(1 for row in analysis.ledger if row.outcome == "missed")
    summary(
        f"[{fault}, back after {back - hit:.1f} s] {analysis} | "
        f"missed (recorded)={missed} runs from 1.5 s after={len(after)} "
        f"outcomes={outcomes(analysis)} exit={codes}"
    )
    late_ticks = [(job, t) for job, t in analysis.unrun if monotonic_at(t) > back + 1.5]
    assert late_ticks == [], f"ticks after the fault that did not run: {late_ticks}"
