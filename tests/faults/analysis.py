"""What the replicas did, checked against what replicron promises.

Inputs are the replicas' events files (what the tasks really did, stamped with the machine's
monotonic clock) and the ledger ``replicron_runs`` (what the backend recorded), plus the
advisory locks still held once every replica is down. :func:`analyse` turns them into an
:class:`Analysis`; :func:`assert_invariants` fails with all violations at once.

Monotonic stamps of different processes compare directly: ``CLOCK_MONOTONIC`` is one clock
for the whole machine, network namespaces included, and libfaketime leaves it alone. To
compare a start with its tick (a UTC instant), a stamp is turned into real time with *this*
process's ``time.time() - time.monotonic()``, valid because the test process is never under
libfaketime.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "LEDGER_QUERY",
    "AdvisoryLock",
    "Analysis",
    "LedgerRow",
    "Run",
    "Window",
    "analyse",
    "assert_invariants",
    "monotonic_at",
    "read_events",
    "real_time",
]

LEDGER_QUERY = (
    "SELECT run_id, job, scheduled_at, replica_id, started_at, finished_at, heartbeat_at,"
    " outcome, error FROM replicron_runs ORDER BY run_id"
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: No run may start more than this long before its tick (real time).
EARLY_LIMIT_MS = 500.0


def real_time(mono: float) -> datetime:
    """The real (UTC) instant of a ``time.monotonic()`` stamp taken by any process here."""
    return datetime.fromtimestamp(mono + (time.time() - time.monotonic()), UTC)


def monotonic_at(instant: datetime) -> float:
    """The ``time.monotonic()`` value at a real instant (the inverse of :func:`real_time`),
    for waiting until a tick: ``time.monotonic() >= monotonic_at(tick)``."""
    return instant.timestamp() - (time.time() - time.monotonic())


@dataclass(frozen=True)
class LedgerRow:
    run_id: int
    job: str
    scheduled_at: datetime
    replica_id: str
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    outcome: str | None
    error: str | None


@dataclass(frozen=True)
class AdvisoryLock:
    pid: int
    application_name: str | None
    key: int


@dataclass(frozen=True)
class Run:
    """One task execution, from its "start" and (if it came) "finish" events."""

    replica: str
    pid: int
    job: str
    tick: datetime
    run_id: int | None
    start_mono: float
    start_wall: float  # the replica's own time.time(): shifted under libfaketime
    finish_mono: float | None
    cancelled: bool | None

    def end(self, replica_ends: Mapping[int, float]) -> float:
        """When the run stopped running: its finish, else its process's end, else never."""
        if self.finish_mono is not None:
            return self.finish_mono
        return replica_ends.get(self.pid, math.inf)

    def lead_ms(self) -> float:
        """How long after its tick the run started, in real time (negative: before it)."""
        return (real_time(self.start_mono) - self.tick).total_seconds() * 1000

    def __str__(self) -> str:
        return f"{self.job}@{self.tick:%H:%M:%S.%f}[run {self.run_id} on {self.replica}]"


@dataclass(frozen=True)
class Window:
    """The real-time span [start, end] in which a test expects every tick to be handled."""

    start: datetime
    end: datetime

    @classmethod
    def from_monotonic(cls, start: float, end: float) -> Window:
        return cls(real_time(start), real_time(end))

    def ticks(self, every_s: float) -> list[datetime]:
        """The anchored ticks (multiples of ``every_s`` seconds since the epoch) inside."""
        step = timedelta(seconds=every_s)
        k = math.ceil((self.start - EPOCH) / step)
        ticks = []
        while (tick := EPOCH + k * step) <= self.end:
            ticks.append(tick)
            k += 1
        return ticks

    def __str__(self) -> str:
        return f"{self.start:%H:%M:%S.%f}..{self.end:%H:%M:%S.%f}"


def read_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every event of the given files, in monotonic order. A torn last line (a process
    killed mid-write) is ignored."""
    events = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(events, key=lambda e: float(e["mono"]))


def runs_from(events: Iterable[Mapping[str, Any]]) -> list[Run]:
    finishes: dict[tuple[int, str, str, str], Mapping[str, Any]] = {}
    starts = []
    for event in events:
        key = (
            int(event["pid"]),
            str(event.get("job")),
            str(event.get("tick")),
            str(event.get("run_id")),
        )
        if event["event"] == "start":
            starts.append((key, event))
        elif event["event"] == "finish":
            finishes[key] = event
    runs = []
    for key, start in starts:
        finish = finishes.get(key)
        runs.append(
            Run(
                replica=str(start["replica"]),
                pid=key[0],
                job=key[1],
                tick=datetime.fromisoformat(key[2]).astimezone(UTC),
                run_id=start.get("run_id"),
                start_mono=float(start["mono"]),
                start_wall=float(start["wall"]),
                finish_mono=None if finish is None else float(finish["mono"]),
                cancelled=None if finish is None else bool(finish["cancelled"]),
            )
        )
    return runs


@dataclass(frozen=True)
class Analysis:
    window: Window
    ticks: dict[str, list[datetime]]  # job -> its ticks in the window
    runs: list[Run]
    duplicates: list[Run]  # starts beyond the first of their tick
    overlaps: list[tuple[Run, Run]]  # runs of one job going on at the same time
    unrecorded: list[tuple[str, datetime]]  # window ticks without a ledger row
    unrun: list[tuple[str, datetime]]  # window ticks no task started for (may be legitimate)
    open_rows: list[LedgerRow]  # ledger rows without an outcome
    leaked_locks: list[AdvisoryLock]
    earliest: Run | None  # the run that started earliest relative to its tick
    ledger: list[LedgerRow] = field(repr=False)

    @property
    def tick_count(self) -> int:
        return sum(len(ticks) for ticks in self.ticks.values())

    @property
    def earliest_ms(self) -> float | None:
        return None if self.earliest is None else self.earliest.lead_ms()

    def violations(self, *, early_limit_ms: float = EARLY_LIMIT_MS) -> list[str]:
        """Each broken promise, in words (empty when all hold)."""
        found = []
        if self.duplicates:
            found.append(f"duplicate runs: {[str(r) for r in self.duplicates]}")
        if self.overlaps:
            found.append(f"overlapping runs: {[f'{a} & {b}' for a, b in self.overlaps]}")
        if self.unrecorded:
            found.append(f"ticks without a ledger row: {_ticks(self.unrecorded)}")
        if self.open_rows:
            found.append(
                f"ledger rows without an outcome: {[(r.job, r.run_id) for r in self.open_rows]}"
            )
        if self.leaked_locks:
            found.append(f"advisory locks left held: {self.leaked_locks}")
        earliest = self.earliest_ms
        if earliest is not None and earliest < -early_limit_ms:
            found.append(f"{self.earliest} started {-earliest:.0f} ms before its tick")
        return found

    def __str__(self) -> str:
        earliest = "n/a" if self.earliest_ms is None else f"{self.earliest_ms:+.0f}ms"
        return (
            f"ticks={self.tick_count} runs={len(self.runs)} duplicates={len(self.duplicates)} "
            f"overlaps={len(self.overlaps)} unrecorded={len(self.unrecorded)} "
            f"open_rows={len(self.open_rows)} leaked_locks={len(self.leaked_locks)} "
            f"earliest={earliest}"
        )


def _ticks(ticks: Sequence[tuple[str, datetime]]) -> list[str]:
    return [f"{job}@{tick:%H:%M:%S.%f}" for job, tick in ticks]


def analyse(
    *,
    events: Iterable[Mapping[str, Any]],
    ledger: Sequence[LedgerRow],
    jobs: Mapping[str, float],
    window: Window,
    replica_ends: Mapping[int, float],
    leaked_locks: Sequence[AdvisoryLock] = (),
) -> Analysis:
    """``jobs`` maps each job to its interval (s); ``replica_ends`` each replica process (pid)
    that is gone to when (monotonic): an unfinished run of it counts as running until then."""
    runs = sorted(runs_from(events), key=lambda r: r.start_mono)
    seen: set[tuple[str, datetime]] = set()
    duplicates = []
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if (run.job, run.tick) in seen:
            duplicates.append(run)
        seen.add((run.job, run.tick))
        by_job[run.job].append(run)
    overlaps = [
        (a, b)
        for job_runs in by_job.values()
        for i, a in enumerate(job_runs)
        for b in job_runs[i + 1 :]
        if b.start_mono < a.end(replica_ends)  # sorted by start: a started first
    ]
    ticks = {job: window.ticks(every_s) for job, every_s in sorted(jobs.items())}
    rows = {(row.job, row.scheduled_at.astimezone(UTC)) for row in ledger}
    expected = [(job, tick) for job, job_ticks in ticks.items() for tick in job_ticks]
    return Analysis(
        window=window,
        ticks=ticks,
        runs=runs,
        duplicates=duplicates,
        overlaps=overlaps,
        unrecorded=[t for t in expected if t not in rows],
        unrun=[t for t in expected if t not in seen],
        open_rows=[row for row in ledger if row.outcome is None],
        leaked_locks=list(leaked_locks),
        earliest=min(runs, key=Run.lead_ms, default=None),
        ledger=list(ledger),
    )


def assert_invariants(
    analysis: Analysis, *, all_ran: bool = False, early_limit_ms: float = EARLY_LIMIT_MS
) -> None:
    """Fail with every violation: duplicates, overlaps, unrecorded ticks, open rows, leaked
    locks, a start more than ``early_limit_ms`` before its tick; with ``all_ran``, also a
    window tick that no task started for."""
    found = analysis.violations(early_limit_ms=early_limit_ms)
    if all_ran and analysis.unrun:
        found.append(f"window ticks that did not run: {_ticks(analysis.unrun)}")
    if found:
        details = "\n  ".join(found)
        raise AssertionError(f"{analysis} (window {analysis.window})\n  {details}")
