"""Several replica processes, one PostgreSQL, real time: the promises of docs/architecture.md.

Every count is read from the database: ``acceptance_runs`` (what the tasks really did, stamped
with the database clock by the replicas) and ``replicron_runs`` (the backend's ledger). Each
scenario prints one summary line (ticks, runs, duplicates, overlaps, leaked locks, ...).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from replicron import job_lock_key
from tests.acceptance.conftest import Cluster

HEARTBEAT = 0.5  # heartbeat_interval of the replicas (seconds)
STALE = 1.5  # stale_after
#: Outcomes of ticks whose task really started (a skipped tick's row may carry a start time).
RAN = ("succeeded", "failed", "timed_out", "abandoned")
SECOND = timedelta(seconds=1)
CLEAN = "locks=0 sessions=0"  # what a replica should find right after its shutdown()


@dataclass(frozen=True)
class Run:
    """A row of acceptance_runs: one task execution as its replica recorded it."""

    replica: str
    scheduled_at: datetime
    run_id: int | None
    started_at: datetime
    finished_at: datetime | None
    cancelled: bool | None


@dataclass(frozen=True)
class LedgerRow:
    run_id: int
    replica: str
    scheduled_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    outcome: str | None
    error: str | None


#: The columns of acceptance_runs that make a Run, in its order.
RUN_COLUMNS = "replica, scheduled_at, run_id, started_at, finished_at, cancelled"


def runs_of(cluster: Cluster, job: str) -> list[Run]:
    query = f"SELECT {RUN_COLUMNS} FROM acceptance_runs WHERE job = %s ORDER BY started_at"
    return [Run(*row) for row in cluster.rows(query, (job,))]


def ledger_of(cluster: Cluster, job: str) -> list[LedgerRow]:
    query = (
        "SELECT run_id, replica_id, scheduled_at, started_at, finished_at, heartbeat_at,"
        " outcome, error FROM replicron_runs WHERE job = %s ORDER BY run_id"
    )
    return [LedgerRow(*row) for row in cluster.rows(query, (job,))]


def duplicates(runs: Sequence[Run]) -> int:
    """Runs beyond the first of their tick."""
    return len(runs) - len({r.scheduled_at for r in runs})


def overlapping_pairs(intervals: Sequence[tuple[datetime, datetime]]) -> int:
    """Pairs of intervals [start, end) that share some time."""
    ordered = sorted(intervals)
    return sum(
        1 for i, (_, end) in enumerate(ordered) for start, _ in ordered[i + 1 :] if start < end
    )


def ticks_between(first: datetime, last: datetime, step: int) -> list[datetime]:
    """The anchored ticks (multiples of ``step`` seconds since the epoch) in [first, last]."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    k = math.ceil((first - epoch).total_seconds() / step)
    ticks = []
    while (tick := epoch + timedelta(seconds=k * step)) <= last:
        ticks.append(tick)
        k += 1
    return ticks


def unrecorded(ledger: Sequence[LedgerRow], step: int) -> list[datetime]:
    """Ticks from the first to the last in the ledger without a row or without an outcome
    ("nothing silent": every tick ends in exactly one recorded outcome)."""
    if not ledger:
        return []
    ticks = [row.scheduled_at for row in ledger]
    done = {row.scheduled_at for row in ledger if row.outcome is not None}
    return [t for t in ticks_between(min(ticks), max(ticks), step) if t not in done]


def after_text(after: dict[str, str]) -> str:
    """The replicas' own check right after shutdown(), in short."""
    if after and all(detail == CLEAN for detail in after.values()):
        return f"{CLEAN} on {len(after)} replicas"
    return str(after)


def counts(
    ledger: Sequence[LedgerRow],
    runs: Sequence[Run],
    overlaps: int,
    ledger_overlaps: int,
    leaked: Sequence[tuple[int, int]],
    after: dict[str, str],
) -> str:
    """What the summary lines of the faults mid-run count, in short."""
    return (
        f"ticks={len(ledger)} unrecorded ticks={len(unrecorded(ledger, 2))} runs={len(runs)} "
        f"duplicates={duplicates(runs)} overlaps={overlaps} ledger overlaps={ledger_overlaps} "
        f"leaked locks={len(leaked)} (after shutdown(): {after_text(after)}) ledger outcomes="
        f"{dict(Counter(row.outcome for row in ledger))}"
    )


def ms(delta: timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def wait_seconds(cluster: Cluster, since: datetime, seconds: float) -> None:
    """Let the replicas run until ``seconds`` have passed on the database clock."""

    def passed() -> bool:
        return cluster.now() - since >= timedelta(seconds=seconds)

    cluster.wait_until(f"{seconds} s to pass", passed, seconds + 30, every=0.2)


def second_run_in_progress(cluster: Cluster, job: str) -> Callable[[], Run | None]:
    """A check: a run of ``job`` that started over a second ago and is still going, after
    an earlier run completed (so the ticks skipped during a run have been seen too)."""

    def check() -> Run | None:
        rows = cluster.rows(
            f"SELECT {RUN_COLUMNS} FROM acceptance_runs WHERE job = %(job)s AND finished_at IS NULL"
            " AND started_at < clock_timestamp() - interval '1 second'"
            " AND EXISTS (SELECT 1 FROM acceptance_runs done"
            "             WHERE done.job = %(job)s AND done.finished_at IS NOT NULL)"
            " ORDER BY started_at LIMIT 1",
            {"job": job},
        )
        return Run(*rows[0]) if rows else None

    return check


def sleep_until_phase(cluster: Cluster, period: int, phase: float) -> datetime:
    """Sleep until the database clock is ``phase`` seconds past a tick of a ``period``-second
    interval job (the replicas' clocks are the same host clock); return that instant."""
    into = cluster.now().timestamp() % period
    time.sleep((phase - into) % period)
    return cluster.now()


def running_victim(cluster: Cluster, job: str) -> tuple[Run, str, int]:
    """Three replicas running ``job`` (every 2 s, a 6 s task, overlap skip), once a second
    run of it is in progress: that run, its replica and the server pid of its lock session,
    which holds the job's lock."""
    for replica in ("r1", "r2", "r3"):
        cluster.start(
            replica,
            job=job,
            every_s=2,
            task_ms=6000,
            heartbeat_interval=HEARTBEAT,
            stale_after=STALE,
            stop_timeout=1.0,
        )
    cluster.wait_ready(["r1", "r2", "r3"])
    run = cluster.wait_until("a run in progress", second_run_in_progress(cluster, job), 40)
    pid = cluster.lock_session_pid(run.replica)
    assert pid is not None
    assert (pid, job_lock_key(job)) in cluster.advisory_locks(), (
        "the running replica holds the lock"
    )
    return run, run.replica, pid


def recorded_row(cluster: Cluster, job: str, run: Run, what: str, timeout: float) -> LedgerRow:
    """Wait until ``run`` has its outcome in the ledger; its row."""

    def recorded() -> LedgerRow | None:
        row = next(r for r in ledger_of(cluster, job) if r.run_id == run.run_id)
        return row if row.outcome is not None else None

    return cluster.wait_until(what, recorded, timeout)


def stop_and_read(
    cluster: Cluster, job: str
) -> tuple[dict[str, int], list[tuple[int, int]], dict[str, str], list[Run], list[LedgerRow]]:
    """Stop every replica; their exit codes, the advisory locks left, what each found right
    after its shutdown(), and the job's runs and ledger."""
    codes = cluster.stop()
    leaked = cluster.advisory_locks()
    after = cluster.after_shutdown()
    return codes, leaked, after, runs_of(cluster, job), ledger_of(cluster, job)


# ---- 1. skewed clocks --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_skewed_clocks_run_every_tick_exactly_once(
    cluster: Cluster, summary: Callable[[str], None]
) -> None:
    job = "every1"
    offsets = {"r1": 0, "r2": 150, "r3": 300}
    for replica, offset in offsets.items():
        cluster.start(replica, job=job, every_s=1, task_ms=20, clock_offset_ms=offset)
    ready = cluster.wait_ready(offsets)
    first = ticks_between(max(ready.values()) + SECOND / 2, max(ready.values()) + 2 * SECOND, 1)[0]

    def enough() -> bool:
        [(n,)] = cluster.rows(
            "SELECT count(*) FROM acceptance_runs WHERE job = %s AND scheduled_at >= %s",
            (job, first),
        )
        return bool(n >= 23)

    cluster.wait_until("23 ticks with all three replicas up", enough, 60, every=0.2)
    stop_at = cluster.now()
    codes, leaked, after, runs, ledger = stop_and_read(cluster, job)
    expected = ticks_between(first, stop_at - SECOND / 2, 1)
    in_window = sorted(r.scheduled_at for r in runs if first <= r.scheduled_at <= expected[-1])
    gaps = sorted(set(expected) - set(in_window))
    span = ticks_between(min(r.scheduled_at for r in runs), max(r.scheduled_at for r in runs), 1)
    overlaps = overlapping_pairs([(r.started_at, r.finished_at or stop_at) for r in runs])
    by_replica = Counter(r.replica for r in runs)
    outcomes = Counter(row.outcome for row in ledger)
    lateness = {
        replica: ms(max(r.started_at - r.scheduled_at for r in runs if r.replica == replica))
        for replica in sorted(by_replica)
    }
    summary(
        f"[1 skewed clocks 0/150/300 ms, every 1 s, 20 ms task] window ticks={len(expected)} "
        f"runs in window={len(in_window)} gaps={len(gaps)} | whole test: ticks={len(span)} "
        f"runs={len(runs)} duplicates={duplicates(runs)} overlaps={overlaps} "
        f"leaked locks={len(leaked)} "
        f"(after shutdown(): {after_text(after)}) | "
        f"runs by replica={dict(sorted(by_replica.items()))} "
        f"max start-minus-tick ms={lateness} ledger outcomes={dict(outcomes)} exit codes={codes}"
    )

    assert len(expected) >= 20
    assert in_window == expected, f"gaps {gaps}"
    assert duplicates(runs) == 0
    assert sorted(r.scheduled_at for r in runs) == span  # no gap anywhere either
    assert overlaps == 0
    assert leaked == []
    assert after == dict.fromkeys(codes, CLEAN)
    assert codes == {"r1": 0, "r2": 0, "r3": 0}
    # The ledger agrees with what ran: one succeeded row per run, same replica and run id.
    ran = {(row.scheduled_at, row.replica, row.run_id) for row in ledger if row.outcome in RAN}
    assert ran == {(r.scheduled_at, r.replica, r.run_id) for r in runs}
    assert all(row.outcome == "succeeded" for row in ledger if row.outcome in RAN)
    assert outcomes.get(None, 0) == 0


# ---- 2. staggered starts -----------------------------------------------------------------


@pytest.mark.timeout(120)
def test_staggered_starts_run_once_per_interval(
    cluster: Cluster, summary: Callable[[str], None]
) -> None:
    job = "every2"
    replicas = ["r1", "r2", "r3"]
    for i, replica in enumerate(replicas):
        if i:
            # Start the replicas 0.7 s apart: anchored ticks must not depend on start times.
            time.sleep(0.7)
        cluster.start(replica, job=job, every_s=2, task_ms=20)
    ready = cluster.wait_ready(replicas)
    first_ready = min(ready.values())
    wait_seconds(cluster, first_ready, 20)
    stop_at = cluster.now()
    codes, leaked, after, runs, ledger = stop_and_read(cluster, job)
    expected = ticks_between(first_ready + timedelta(microseconds=1), stop_at - SECOND / 2, 2)
    in_window = sorted(r.scheduled_at for r in runs if expected[0] <= r.scheduled_at)
    in_window = [t for t in in_window if t <= expected[-1]]
    overlaps = overlapping_pairs([(r.started_at, r.finished_at or stop_at) for r in runs])
    outcomes = Counter(row.outcome for row in ledger)
    stagger = "/".join(str(ms(ready[r] - first_ready)) for r in replicas)
    span = ticks_between(min(r.scheduled_at for r in runs), max(r.scheduled_at for r in runs), 2)
    summary(
        f"[2 starts 0.7 s apart (ready at +{stagger} ms), every 2 s, 20 ms task] "
        f"window ticks={len(expected)} runs in window={len(in_window)} | whole test: "
        f"ticks={len(span)} runs={len(runs)} "
        f"duplicates={duplicates(runs)} overlaps={overlaps} leaked locks={len(leaked)} "
        f"(after shutdown(): {after_text(after)}) "
        f"runs by replica={dict(sorted(Counter(r.replica for r in runs).items()))} "
        f"ledger outcomes={dict(outcomes)} exit codes={codes}"
    )

    assert len(expected) >= 9
    assert in_window == expected
    assert duplicates(runs) == 0
    assert sorted(r.scheduled_at for r in runs) == span  # no gap anywhere either
    assert overlaps == 0
    assert leaked == []
    assert after == dict.fromkeys(codes, CLEAN)
    assert codes == dict.fromkeys(replicas, 0)
    assert all(r.scheduled_at.timestamp() % 2 == 0 for r in runs)
    ran = {(row.scheduled_at, row.replica, row.run_id) for row in ledger if row.outcome in RAN}
    assert ran == {(r.scheduled_at, r.replica, r.run_id) for r in runs}


# ---- 3. kill -9 mid-run ------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_kill_9_of_the_running_replica(cluster: Cluster, summary: Callable[[str], None]) -> None:
    job = "long"
    victim_run, victim, victim_pid = running_victim(cluster, job)

    # Kill 0.5 s before the next tick: the dead replica's lock goes with its session at once,
    # but its run's heartbeat stays fresh for STALE seconds, and that tick falls in between.
    sleep_until_phase(cluster, 2, 1.5)
    cluster.kill(victim)
    killed_at = cluster.now()
    # The server sees the socket close and ends the dead replica's session: how long did its
    # backend keep the lock?
    cluster.wait_until(
        "the killed replica's backend to drop its lock",
        lambda: all(pid != victim_pid for pid, _ in cluster.advisory_locks()),
        40,
        every=0.005,
    )
    lock_gone_at = cluster.now()

    def later_run() -> Run | None:
        return next(
            (r for r in runs_of(cluster, job) if r.started_at > killed_at and r.replica != victim),
            None,
        )

    successor = cluster.wait_until("a later run on another replica", later_run, 20)

    victim_row = recorded_row(cluster, job, victim_run, "the killed run to be recorded", 20)
    codes, leaked, after, runs, ledger = stop_and_read(cluster, job)
    unfinished = [r for r in runs if r.finished_at is None and r.run_id != victim_run.run_id]
    far = killed_at + timedelta(days=1)
    intervals = [
        (r.started_at, killed_at if r.run_id == victim_run.run_id else (r.finished_at or far))
        for r in runs
    ]
    overlaps = overlapping_pairs(intervals)
    # In the ledger the killed run counts as going on until its heartbeat went stale.
    assert victim_row.heartbeat_at is not None
    assert victim_row.started_at is not None
    stale_at = victim_row.heartbeat_at + timedelta(seconds=STALE)
    ran = [row for row in ledger if row.outcome in RAN and row.started_at is not None]
    ledger_overlaps = overlapping_pairs(
        [
            (
                row.started_at,
                stale_at if row.run_id == victim_run.run_id else row.finished_at or far,
            )
            for row in ran
            if row.started_at is not None
        ]
    )
    early = [
        row
        for row in ran
        if row.run_id != victim_run.run_id
        and row.started_at is not None
        and victim_row.started_at < row.started_at < stale_at
    ]
    # Ticks that fell due after the kill, while the dead run's heartbeat was still fresh.
    stale_window = [row for row in ledger if killed_at < row.scheduled_at < stale_at]
    silent = unrecorded(ledger, 2)
    summary(
        f"[3 kill -9 of {victim} mid-run, every 2 s, 6 s task] "
        f"{counts(ledger, runs, overlaps, ledger_overlaps, leaked, after)} runs started "
        f"before the dead run went stale={len(early)} | dead backend kept its lock "
        f"<= {ms(lock_gone_at - killed_at)} ms after the kill; heartbeat stale "
        f"{ms(stale_at - killed_at)} ms after the kill; ticks due in between="
        f"{[row.outcome for row in stale_window]}; next run started "
        f"{ms(successor.started_at - killed_at)} ms after the kill on {successor.replica}; "
        f"killed row {victim_row.outcome!r} ({victim_row.error}); exit codes={codes}"
    )

    assert silent == []
    assert duplicates(runs) == 0
    assert unfinished == []
    assert overlaps == 0
    assert ledger_overlaps == 0
    assert early == []
    assert len(stale_window) >= 1
    assert all(row.outcome == "skipped_overlap" for row in stale_window)
    assert successor.started_at >= stale_at
    assert victim_row.outcome == "abandoned"
    assert leaked == []
    assert after == dict.fromkeys(codes, CLEAN)
    assert codes == {r: 0 for r in ("r1", "r2", "r3") if r != victim}


# ---- 4. the lock session is terminated mid-run -------------------------------------------


@pytest.mark.timeout(150)
def test_terminated_lock_session_signals_and_abandons_the_run(
    cluster: Cluster, summary: Callable[[str], None]
) -> None:
    job = "long"
    victim_run, victim, victim_pid = running_victim(cluster, job)

    # Cut the session 0.2 s before a tick: the run goes on until its replica notices, and
    # the tick is claimed meanwhile with the lock already free.
    sleep_until_phase(cluster, 2, 1.8)
    terminated_at = cluster.now()
    [(terminated,)] = cluster.rows("SELECT pg_terminate_backend(%s)", (victim_pid,))
    assert terminated

    def signalled() -> Run | None:
        run = next(r for r in runs_of(cluster, job) if r.run_id == victim_run.run_id)
        return run if run.finished_at is not None else None

    victim_done = cluster.wait_until("the cut-off run to return", signalled, 10)

    victim_row = recorded_row(cluster, job, victim_run, "the cut-off run to be recorded", 10)

    def reconnected() -> int | None:
        pid = cluster.lock_session_pid(victim)
        return pid if pid is not None and pid != victim_pid else None

    new_pid = cluster.wait_until(f"{victim} to open a new lock session", reconnected, 15)

    def later_run() -> Run | None:
        return next((r for r in runs_of(cluster, job) if r.started_at > terminated_at), None)

    successor = cluster.wait_until("a later run", later_run, 20)
    codes, leaked, after, runs, ledger = stop_and_read(cluster, job)
    assert victim_done.finished_at is not None
    far = terminated_at + timedelta(days=1)
    overlaps = overlapping_pairs([(r.started_at, r.finished_at or far) for r in runs])
    ran = [row for row in ledger if row.outcome in RAN and row.started_at is not None]
    ledger_overlaps = overlapping_pairs(
        [(row.started_at, row.finished_at or far) for row in ran if row.started_at is not None]
    )
    # Ticks that fell due after the session was cut, while the cut-off run was still going.
    cut_window = [
        row for row in ledger if terminated_at < row.scheduled_at < victim_done.finished_at
    ]
    silent = unrecorded(ledger, 2)
    summary(
        f"[4 pg_terminate_backend of {victim}'s lock session mid-run, every 2 s, 6 s task] "
        f"{counts(ledger, runs, overlaps, ledger_overlaps, leaked, after)} | "
        f"cut-off run cancelled={victim_done.cancelled} returned "
        f"{ms(victim_done.finished_at - terminated_at)} ms after the termination, recorded "
        f"{victim_row.outcome!r} ({victim_row.error}); ticks due while it still ran="
        f"{[row.outcome for row in cut_window]}; next run started "
        f"{ms(successor.started_at - terminated_at)} ms after on {successor.replica}; "
        f"{victim} reconnected (pid {victim_pid} -> {new_pid}); exit codes={codes}"
    )

    assert victim_done.cancelled is True
    assert victim_row.outcome == "abandoned"
    assert all(row.outcome not in RAN for row in cut_window)
    assert successor.started_at >= victim_done.finished_at
    assert silent == []
    assert duplicates(runs) == 0
    assert overlaps == 0
    assert ledger_overlaps == 0
    assert leaked == []
    assert after == dict.fromkeys(codes, CLEAN)
    assert codes == {"r1": 0, "r2": 0, "r3": 0}
