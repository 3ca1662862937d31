"""Three replica processes running one fixed-delay job (``after(seconds=2)``, a 1 s task),
real time, on the embedded backend and on PostgreSQL (both coordination modes): the job
runs every ~3 s (delay plus duration) on some replica, each tick once, never two at once,
and every tick in the ledger is the previous row's recorded finish plus the delay.

What the tasks really did comes from the replicas' ``start``/``finish`` events; the ledger
from ``replicron_runs``. Each scenario prints one summary line.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests._harness.replicas import Replicas
from tests._harness.reporting import report_on_failure
from tests.helpers import embedded_rows, fresh_database

DELAY, TASK = 2.0, 1.0  # seconds
JOB = "fixed-delay"
RUN_FOR = 24.0  # seconds of real time: about 8 runs


@dataclass(frozen=True)
class TaskRun:
    replica: str
    tick: str
    started: float  # wall time
    finished: float | None


@dataclass(frozen=True)
class LedgerRow:
    tick: datetime
    finished_at: datetime | None
    outcome: str | None
    replica: str


class Fleet(Replicas):
    def __init__(self, log_dir: Path, backend: dict[str, Any], ledger: Any) -> None:
        super().__init__(log_dir)
        self.backend, self._ledger = backend, ledger

    def start(self, replica_id: str, **extra: object) -> None:
        options = {
            **self.backend,
            "job": JOB,
            "every_s": DELAY,
            "fixed_delay": True,
            "task_ms": int(TASK * 1000),
            "seconds": 150,
            **extra,
        }
        self.spawn_replica(replica_id, options)

    def task_runs(self) -> list[TaskRun]:
        finished = {(e["pid"], e["run_id"]): e["wall"] for e in self.events("finish")}
        runs = [
            TaskRun(e["replica"], e["tick"], e["wall"], finished.get((e["pid"], e["run_id"])))
            for e in self.events("start")
        ]
        return sorted(runs, key=lambda run: run.started)

    def ledger(self) -> list[LedgerRow]:
        rows: list[LedgerRow] = self._ledger()
        return sorted(rows, key=lambda row: row.tick)


def embedded_ledger(state_dir: Path) -> Any:
    def read() -> list[LedgerRow]:
        return [
            LedgerRow(r["scheduled_at"], r["finished_at"], r["outcome"], r["replica_id"])
            for r in embedded_rows(state_dir, JOB)
        ]

    return read


def postgres_ledger(dsn: str) -> Any:
    def read() -> list[LedgerRow]:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT scheduled_at, finished_at, outcome, replica_id FROM replicron_runs"
                " WHERE job = %s",
                [JOB],
            ).fetchall()
        return [LedgerRow(*row) for row in rows]

    return read


@pytest.fixture(params=["embedded", "postgres", "postgres-lease"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    if request.param == "embedded":
        state_dir = tmp_path / "state"
        state_dir.mkdir()
        made = Fleet(tmp_path, {"state_dir": state_dir}, embedded_ledger(state_dir))
        report_on_failure(request, "replica logs", made.logs)
        try:
            yield made
        finally:
            made.close()
        return
    coordination = "lease" if request.param == "postgres-lease" else "advisory"
    with fresh_database("replicron_acc") as dsn:
        made = Fleet(tmp_path, {"dsn": dsn, "coordination": coordination}, postgres_ledger(dsn))
        report_on_failure(request, "replica logs", made.logs)
        try:
            yield made
        finally:
            made.close()


def overlapping_pairs(runs: list[TaskRun]) -> int:
    spans = sorted((r.started, r.finished or float("inf")) for r in runs)
    return sum(1 for i, (_, end) in enumerate(spans) for start, _ in spans[i + 1 :] if start < end)


@pytest.mark.timeout(240)
def test_three_replicas_run_a_fixed_delay_job_once_per_finish(
    fleet: Fleet, request: pytest.FixtureRequest
) -> None:
    for replica in ("r1", "r2", "r3"):
        fleet.start(replica)
    fleet.ready_events(["r1", "r2", "r3"], timeout=60)
    time.sleep(RUN_FOR)
    fleet.stop()
    runs = [r for r in fleet.task_runs() if r.finished is not None]
    ledger = fleet.ledger()
    ticks = Counter(r.tick for r in fleet.task_runs())
    duplicates = sum(n - 1 for n in ticks.values())
    overlaps = overlapping_pairs(fleet.task_runs())
    periods = [b.started - a.started for a, b in itertools.pairwise(runs)]
    waits = [b.started - a.finished for a, b in itertools.pairwise(runs) if a.finished]
    # Each tick is the previous row's recorded finish plus the delay, to the microsecond.
    links = [
        (b.tick - a.finished_at).total_seconds()
        for a, b in itertools.pairwise(ledger)
        if a.finished_at is not None
    ]
    print(
        f"\n{request.node.callspec.id}: runs={len(runs)} duplicates={duplicates} "
        f"overlaps={overlaps} period median={statistics.median(periods):.3f}s "
        f"min={min(periods):.3f}s max={max(periods):.3f}s, finish-to-start min={min(waits):.3f}s "
        f"max={max(waits):.3f}s, replicas={dict(Counter(r.replica for r in runs))}, "
        f"ledger outcomes={dict(Counter(row.outcome for row in ledger))}"
    )
    assert duplicates == 0
    assert overlaps == 0
    assert len(runs) >= 5, runs
    assert set(links) == {DELAY}, links
    assert all(row.outcome == "succeeded" for row in ledger[:-1]), ledger
    # About delay + duration apart (generous upper bounds: two cores shared by many tests).
    assert DELAY + TASK - 0.05 <= statistics.median(periods) <= DELAY + TASK + 1.5
    assert min(waits) >= DELAY - 0.05
    assert max(waits) <= DELAY + 3.0
