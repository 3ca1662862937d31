"""A rolling restart mid-burst: the replica that stops leaves the burst's ticks it had not
claimed to the replicas that stay (each of them keeps the ticks it did not claim either, and
claims them as its threads free up), so none is recorded missed; only a stop of every
replica at once records the ticks nobody will run, and each of those gets its row."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tests.faults.analysis import Window
from tests.faults.fleet import Fleet, both_modes

Summary = Callable[[str], None]
JOBS, EVERY_S, TASK_MS = 6, 10, 1000  # a burst of 6 s of work on 2 one-thread replicas


def burst_started(replicas: Fleet, after: float) -> tuple[datetime, float]:
    """The first burst with a run started after ``after`` (monotonic): its tick, and when
    its first run started."""
    events: list[dict[str, Any]] = replicas.wait_until(
        "a burst to start",
        lambda: [e for e in replicas.events("start") if float(e["mono"]) > after][:1] or None,
        EVERY_S + 10,
        every=0.02,
    )
    return datetime.fromisoformat(events[0]["tick"]), float(events[0]["mono"])


def runs_of(replicas: Fleet, event: str, tick: datetime) -> dict[str, str]:
    """The replica of each job's ``event`` ("start", "finish") for ``tick``."""
    return {
        e["job"]: e["replica"]
        for e in replicas.events(event)
        if datetime.fromisoformat(e["tick"]) == tick
    }


def outcomes_at(replicas: Fleet, tick: datetime) -> dict[str, str | None]:
    return {row.job: row.outcome for row in replicas.db.ledger() if row.scheduled_at == tick}


@both_modes
def test_a_replica_stopped_mid_burst_leaves_its_ticks_to_the_one_that_stays(
    replicas: Fleet, summary: Summary
) -> None:
    for replica_id in ("r1", "r2"):
        replicas.start(
            replica_id,
            jobs=JOBS,
            every_s=EVERY_S,
            task_ms=TASK_MS,
            max_workers=1,
            stop_timeout=30,
        )
    ready = replicas.wait_ready(["r1", "r2"])
    tick, began = burst_started(replicas, max(ready.values()) + 0.5)
    stopped_at = time.monotonic() - began
    code, took = replicas.current["r1"].stop()  # as a deploy's SIGTERM, mid-burst
    replicas.wait_until(
        "every run of the burst to finish",
        lambda: len(runs_of(replicas, "finish", tick)) == JOBS,
        EVERY_S + 10,
        every=0.1,
    )
    window = Window.from_monotonic(began - 0.5, began + 0.5)
    replicas.stop()
    analysis = replicas.assert_invariants(window, all_ran=True)
    outcomes = outcomes_at(replicas, tick)
    ran_on = runs_of(replicas, "start", tick)
    summary(
        f"[r1 stopped {stopped_at:.2f} s into a burst of {JOBS} one-second "
        f"runs] {analysis} | r1 exit={code} in {took:.2f} s; runs by replica "
        f"{sorted(ran_on.values())}"
    )
    assert outcomes == dict.fromkeys(ran_on, "succeeded")
    assert len(outcomes) == JOBS
    assert "r2" in ran_on.values()  # the one that stayed took over some of the burst


@both_modes
def test_every_replica_stopped_at_once_records_the_ticks_nobody_runs(
    replicas: Fleet, summary: Summary
) -> None:
    for replica_id in ("r1", "r2"):
        replicas.start(
            replica_id,
            jobs=JOBS,
            every_s=EVERY_S,
            task_ms=TASK_MS,
            max_workers=1,
            stop_timeout=30,
        )
    ready = replicas.wait_ready(["r1", "r2"])
    tick, began = burst_started(replicas, max(ready.values()) + 0.5)
    codes = replicas.stop()
    window = Window.from_monotonic(began - 0.5, began + 0.5)
    analysis = replicas.assert_invariants(window)
    outcomes = outcomes_at(replicas, tick)
    summary(f"[both stopped at once mid-burst] {analysis} | {outcomes} exit={codes}")
    assert len(outcomes) == JOBS  # every tick of the burst has its row
    assert "missed" in outcomes.values()  # 2 threads, 6 runs: not all of them ran


@both_modes
def test_a_replica_that_joined_after_the_burst_is_not_left_its_ticks(
    replicas: Fleet, summary: Summary
) -> None:
    """r2 starts after the burst's instant, so it never planned those ticks: r1, stopping
    while it still holds some, records them missed instead of leaving them to nobody."""
    replicas.start(
        "r1", jobs=JOBS, every_s=EVERY_S, task_ms=TASK_MS, max_workers=1, stop_timeout=30
    )
    ready = replicas.wait_ready(["r1"])
    tick, began = burst_started(replicas, ready["r1"] + 0.5)
    replicas.start(
        "r2", jobs=JOBS, every_s=EVERY_S, task_ms=TASK_MS, max_workers=1, stop_timeout=30
    )
    replicas.wait_ready(["r2"])
    code, _ = replicas.current["r1"].stop()
    window = Window.from_monotonic(began - 0.5, began + 0.5)
    replicas.stop()
    analysis = replicas.assert_invariants(window)
    outcomes = outcomes_at(replicas, tick)
    summary(f"[r2 joined after the burst, r1 stopped] {analysis} | {outcomes} exit={code}")
    assert len(outcomes) == JOBS  # every tick of the burst has its row
    assert "missed" in outcomes.values()  # r1's one thread could not run them all
