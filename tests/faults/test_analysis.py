"""The analysis finds what it is meant to find: fed made-up events and ledger rows (no
process, no database), it counts each kind of violation."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.faults.analysis import (
    AdvisoryLock,
    LedgerRow,
    Window,
    analyse,
    assert_invariants,
    monotonic_at,
    real_time,
)

#: A monotonic instant a while ago, and its real time: a whole second, so that ticks line up
#: with the stamps below.
_MONO = time.monotonic() - 100
_REAL = real_time(_MONO)
BASE = _REAL.replace(microsecond=0)
BASE_MONO = _MONO - _REAL.microsecond / 1e6


def run(pid: int, job: str, second: int, start: float, finish: float | None) -> list[Any]:
    """Start (and finish) events of a run of ``job``'s tick BASE+second, stamped at
    BASE+start and BASE+finish (seconds)."""
    tick = (BASE + timedelta(seconds=second)).isoformat()
    common = {"replica": f"r{pid}", "pid": pid, "job": job, "tick": tick, "run_id": None}
    events = [{**common, "event": "start", "mono": BASE_MONO + start, "wall": 0.0}]
    if finish is not None:
        events.append({**common, "event": "finish", "mono": BASE_MONO + finish, "cancelled": False})
    return events


def row(job: str, second: int, outcome: str | None = "succeeded") -> LedgerRow:
    tick = BASE + timedelta(seconds=second)
    return LedgerRow(second, job, tick, "r1", tick, tick, None, outcome, None)


@pytest.mark.timeout(10)
def test_a_clean_run_has_no_violation() -> None:
    events = run(1, "a", 1, 1.01, 1.2) + run(2, "a", 2, 2.01, 2.2)
    window = Window(BASE + timedelta(seconds=0.5), BASE + timedelta(seconds=2.5))
    analysis = analyse(
        events=events,
        ledger=[row("a", 1), row("a", 2)],
        jobs={"a": 1.0},
        window=window,
        replica_ends={},
    )
    assert_invariants(analysis, all_ran=True)
    assert str(analysis).startswith("ticks=2 runs=2 duplicates=0 overlaps=0 unrecorded=0")
    assert analysis.earliest_ms == pytest.approx(10, abs=5)


@pytest.mark.timeout(10)
def test_each_violation_is_counted() -> None:
    events = (
        run(1, "a", 1, 1.0, 1.5)
        + run(2, "a", 1, 1.2, 1.3)  # the same tick again, during the first: dup + overlap
        + run(1, "b", 1, 1.0, None)  # never finished: its replica died at 3.5 s
        + run(2, "b", 3, 3.0, 3.1)  # ... so this run overlaps it
        + run(2, "c", 5, 4.0, 4.1)  # a second before its tick
    )
    window = Window(BASE + timedelta(seconds=0.5), BASE + timedelta(seconds=3.5))
    analysis = analyse(
        events=events,
        ledger=[row("a", 1), row("b", 1, None), row("b", 3), row("c", 5)],
        jobs={"a": 1.0, "b": 1.0},
        window=window,
        replica_ends={1: BASE_MONO + 3.5},
        leaked_locks=[AdvisoryLock(123, "replicron r1", 42)],
    )
    assert str(analysis) == (
        "ticks=6 runs=5 duplicates=1 overlaps=2 unrecorded=3 open_rows=1 leaked_locks=1 "
        "earliest=-1000ms"
    )
    assert {(a.job, b.job) for a, b in analysis.overlaps} == {("a", "a"), ("b", "b")}
    with pytest.raises(AssertionError, match="duplicate runs"):
        assert_invariants(analysis)


@pytest.mark.timeout(10)
def test_window_ticks_are_anchored_at_the_epoch() -> None:
    window = Window(
        datetime(2030, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC),
        datetime(2030, 1, 1, 0, 0, 7, tzinfo=UTC),
    )
    assert [t.second for t in window.ticks(2)] == [2, 4, 6]
    assert [t.second for t in window.ticks(1)] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.timeout(10)
def test_monotonic_and_real_time_convert_both_ways() -> None:
    now = time.monotonic()
    assert monotonic_at(real_time(now)) == pytest.approx(now, abs=1e-3)
