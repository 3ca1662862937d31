"""Fixed-delay jobs on PostgreSQL (both coordination modes) under clock skew and at a delay
far below the ledger's read cadence: replicas whose wall clocks are 30 s ahead and 10 s
behind (libfaketime) compute the same ticks and never start one early; a 50 ms delay with an
empty task runs each tick once, one at a time, each a delay after the previous finish."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable

import pytest

from tests.faults.analysis import LedgerRow
from tests.faults.cluster import Database
from tests.faults.fleet import Fleet, both_modes

Summary = Callable[[str], None]
JOB = "job-0"


def chain_of(db: Database) -> list[LedgerRow]:
    return sorted((r for r in db.ledger() if r.job == JOB), key=lambda r: r.scheduled_at)


def stopped(replicas: Fleet, db: Database) -> tuple[dict[str, int], list[LedgerRow], int]:
    """Stop the replicas: their exit codes, the job's ledger rows, and the ticks run twice."""
    codes = replicas.stop()
    ran = Counter(e["tick"] for e in replicas.events("start"))
    return codes, chain_of(db), sum(n - 1 for n in ran.values())


def links(chain: list[LedgerRow]) -> list[float]:
    return [
        (b.scheduled_at - a.finished_at).total_seconds()
        for a, b in itertools.pairwise(chain)
        if a.finished_at is not None
    ]


def overlapping(chain: list[LedgerRow]) -> int:
    spans = sorted((r.started_at, r.finished_at) for r in chain if r.started_at and r.finished_at)
    return sum(1 for (_, end), (start, _) in itertools.pairwise(spans) if start < end)


@both_modes
@pytest.mark.timeout(150)
def test_skewed_replicas_follow_one_chain_and_never_run_a_tick_early(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    delay, task_ms = 1.0, 200
    replicas.start("r1", jobs=1, every_s=delay, task_ms=task_ms, fixed_delay=True)
    replicas.start("r2", jobs=1, every_s=delay, task_ms=task_ms, fixed_delay=True, faketime="+30s")
    replicas.start("r3", jobs=1, every_s=delay, task_ms=task_ms, fixed_delay=True, faketime="-10s")
    replicas.wait_ready(["r1", "r2", "r3"], timeout=60)
    time.sleep(15)
    codes, chain, duplicates = stopped(replicas, db)
    early = [
        (r.started_at - r.scheduled_at).total_seconds()
        for r in chain
        if r.started_at is not None and r.started_at < r.scheduled_at
    ]
    found = links(chain)
    summary(
        f"[fixed delay {delay:g} s, {task_ms} ms task; r2 +30 s, r3 -10 s] runs={len(chain)} "
        f"duplicates={duplicates} overlaps={overlapping(chain)} started early by={early} "
        f"links={sorted(set(found))} by replica={dict(Counter(r.replica_id for r in chain))} "
        f"outcomes={dict(Counter(r.outcome for r in chain))} exit={codes}"
    )
    assert duplicates == 0
    assert overlapping(chain) == 0
    assert all(lead > -0.25 for lead in early), early  # the claim's margin at most
    assert set(found) == {delay}, chain
    assert len(chain) >= 5, chain  # about every 1.2 s; a loaded machine halves it at worst


@both_modes
@pytest.mark.timeout(150)
def test_a_delay_below_the_read_cadence_runs_each_tick_once(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    delay, window = 0.05, 10.0
    for replica in ("r1", "r2", "r3"):
        replicas.start(replica, jobs=1, every_s=delay, task_ms=0, fixed_delay=True)
    replicas.wait_ready(["r1", "r2", "r3"], timeout=60)
    time.sleep(window)
    codes, chain, duplicates = stopped(replicas, db)
    found = links(chain)
    first, last = chain[0].scheduled_at, chain[-1].scheduled_at
    rate = len(chain) / max((last - first).total_seconds(), 1e-9)
    summary(
        f"[fixed delay 50 ms, empty task, 3 replicas, {window:g} s] rows={len(chain)} "
        f"({rate:.1f}/s, at most {1 / delay:.0f}/s) duplicates={duplicates} "
        f"overlaps={overlapping(chain)} links min={min(found):.3f} max={max(found):.3f} "
        f"by replica={dict(Counter(r.replica_id for r in chain))} "
        f"outcomes={dict(Counter(r.outcome for r in chain))} exit={codes}"
    )
    assert duplicates == 0
    assert overlapping(chain) == 0
    assert set(found) == {delay}
    assert rate <= 1 / delay + 0.5
    assert len(chain) >= window  # at least one a second on a loaded machine
