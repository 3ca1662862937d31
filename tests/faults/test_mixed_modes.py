"""A replica the others counted gone (frozen past staleness) wakes to find that a replica of
the other coordination mode joined the namespace meanwhile, which nothing live stood in the
way of. The two modes' locks do not see each other, so the one that came back must claim
nothing while the other lives, and claim again once it has stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.faults.analysis import Window, assert_invariants
from tests.faults.cluster import Database
from tests.faults.fleet import Fleet

Summary = Callable[[str], None]
HEARTBEAT, STALE = 0.5, 1.5  # the replicas' heartbeat_interval and stale_after
REFUSED = "claiming nothing until they are gone"


def starts(replicas: Fleet, pid: int, after: float) -> list[dict[str, Any]]:
    return [e for e in replicas.events("start") if e["pid"] == pid and float(e["mono"]) > after]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("frozen", ["lease", "advisory"])
def test_a_replica_woken_beside_the_other_mode_claims_nothing_until_it_is_gone(
    replicas: Fleet, db: Database, summary: Summary, frozen: str
) -> None:
    other = "advisory" if frozen == "lease" else "lease"
    r1 = replicas.start("r1", jobs=1, every_s=1, task_ms=50, coordination=frozen)
    replicas.wait_ready(["r1"])
    [first] = replicas.wait_until(
        "r1 to finish a run",
        lambda: [e for e in replicas.events("finish") if e["pid"] == r1.pid][:1] or None,
        15,
    )
    time.sleep(max(0.0, float(first["mono"]) + 0.1 - time.monotonic()))  # between two runs
    replicas.pause("r1")
    time.sleep(STALE + 1.0)  # r1 is gone for the database, and for itself once it wakes
    # Each of r2's runs outlasts the next tick: a run of r1 beside one would overlap it.
    r2 = replicas.start("r2", jobs=1, every_s=1, task_ms=2500, coordination=other)
    ready = replicas.wait_ready(["r2"])
    replicas.wait_until("r2 to start a run", lambda: starts(replicas, r2.pid, 0) or None, 10)
    woke = time.monotonic()
    replicas.resume("r1")
    r1.wait_log(REFUSED, timeout=10)
    time.sleep(4 * HEARTBEAT + 2.5)  # r2's runs go on, r1 heartbeats beside them
    beside = starts(replicas, r1.pid, woke)
    replicas.stop(["r2"])
    r2_gone = time.monotonic()
    back = replicas.wait_until(
        "r1 to run again", lambda: starts(replicas, r1.pid, r2_gone) or None, 4 * STALE + 10
    )[0]
    window = Window.from_monotonic(ready["r2"] + 0.5, time.monotonic() + 2)
    replicas.wait_window_end(window)
    codes = replicas.stop()
    analysis = replicas.analyse(window)
    summary(
        f"[{frozen} replica frozen {woke - float(first['mono']):.1f} s, a {other} replica "
        f"joined meanwhile] {analysis} | r1 started {len(beside)} runs beside r2, ran again "
        f"{float(back['mono']) - r2_gone:.2f} s after r2 stopped; exit={codes}"
    )
    assert beside == []
    assert_invariants(analysis)
