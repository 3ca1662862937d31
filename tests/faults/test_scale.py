"""A rolling restart of four replicas (each stopped and started again in turn, as a deploy
does) and 500 per-second jobs on three replicas: every tick runs exactly once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from tests.faults.analysis import Window
from tests.faults.fleet import Fleet

Summary = Callable[[str], None]
IDS = ("r1", "r2", "r3", "r4")


@pytest.mark.timeout(180)
def test_a_rolling_restart_of_four_replicas(replicas: Fleet, summary: Summary) -> None:
    for replica_id in IDS:
        replicas.start(replica_id, jobs=4, every_s=1, task_ms=200)
    ready = replicas.wait_ready(IDS)
    start = max(ready.values()) + 0.5
    time.sleep(max(0.0, start + 1 - time.monotonic()))
    restarts = []
    for replica_id in IDS:
        began = time.monotonic()
        codes = replicas.stop([replica_id])
        assert codes == {replica_id: 0}
        replicas.start(replica_id, jobs=4, every_s=1, task_ms=200)
        replicas.wait_ready([replica_id])
        restarts.append(time.monotonic() - began)
        time.sleep(1.0)
    window = Window.from_monotonic(start, time.monotonic() + 1)
    replicas.wait_ticks_finished(window, timeout=30)
    codes = replicas.stop()
    analysis = replicas.assert_invariants(window, all_ran=True)
    by_replica = Counter(run.replica for run in analysis.runs)
    outcomes = Counter(str(row.outcome) for row in analysis.ledger)
    summary(
        f"[rolling restart of 4 replicas, 4 jobs every 1 s, 200 ms task] {analysis} | "
        f"restart took {min(restarts):.1f}-{max(restarts):.1f} s each; runs by replica="
        f"{dict(sorted(by_replica.items()))} outcomes={dict(outcomes)}"
    )
    assert codes == dict.fromkeys(IDS, 0)
    assert set(outcomes) == {"succeeded"}, outcomes  # a deploy runs no tick twice, skips none


@pytest.mark.timeout(180)
def test_500_per_second_jobs_on_three_replicas(replicas: Fleet, summary: Summary) -> None:
    for replica_id in IDS[:3]:
        replicas.start(replica_id, jobs=500, every_s=1, task_ms=5)
    analysis, codes = replicas.run_without_faults(
        IDS[:3], 8, settle=1.5, timeout=60, leak_grace_s=10
    )
    lateness = sorted(run.lead_ms() for run in analysis.runs)
    p50 = lateness[len(lateness) // 2]
    p99 = lateness[int(len(lateness) * 0.99)]
    summary(
        f"[500 jobs every 1 s on 3 replicas, 5 ms task] {analysis} | start after tick "
        f"p50={p50:.0f}ms p99={p99:.0f}ms exit={codes}"
    )
    assert analysis.tick_count >= 500 * 8
