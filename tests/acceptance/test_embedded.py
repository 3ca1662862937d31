"""Several replica processes on one state directory, real time: the embedded backend keeps
the promises of docs/embedded.md across real processes.

Counts come from two places: the SQLite ledger (``replicron_runs``) and what each process
reported when its task really ran (its ``start`` / ``finish`` events, see
``tests/_harness/events.py``). Each scenario prints one summary line.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock, Timeout

from replicron.backends.embedded import LEDGER_NAME, EmbeddedBackend
from tests._harness.processes import Child
from tests._harness.replicas import Replicas
from tests._harness.reporting import report_on_failure
from tests.helpers import embedded_rows


@dataclass(frozen=True)
class Row:
    run_id: int
    job: str
    tick: datetime
    replica: str
    pid: int | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str | None
    error: str | None


class Host(Replicas):
    """The replica processes of one test, sharing one state directory."""

    def __init__(self, state_dir: Path, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.state_dir = state_dir

    def start(self, replica_id: str, *, job: str, task_ms: int, **extra: float) -> Child:
        options = {
            "state_dir": self.state_dir,
            "job": job,
            "every_s": 1,
            "task_ms": task_ms,
            "seconds": 150,
            **extra,
        }
        return self.spawn_replica(replica_id, options)

    def ledger(self, job: str) -> list[Row]:
        return [
            Row(
                r["run_id"],
                r["job"],
                r["scheduled_at"],
                r["replica_id"],
                r["pid"],
                r["started_at"],
                r["finished_at"],
                r["outcome"],
                r["error"],
            )
            for r in embedded_rows(self.state_dir, job)
        ]

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Wait until every replica runs its scheduler; the epoch time the last one did."""
        ready = self.ready_events(self.current, timeout)
        return max(float(event["wall"]) for event in ready.values())


@pytest.fixture
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    (tmp_path / "state").mkdir()
    host = Host(tmp_path / "state", tmp_path)
    report_on_failure(request, "replica logs", host.logs)
    try:
        yield host
    finally:
        host.close()


def lock_is_free(path: Path) -> bool:
    """Whether another process (this test) can take the lock file at once."""
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    lock.release()
    return True


def lock_file(state_dir: Path, job: str) -> Path:
    return EmbeddedBackend(state_dir).lock_path(job)


def test_four_processes_run_each_tick_exactly_once(
    host: Host, summary: Callable[[str], None]
) -> None:
    job = "every1"
    for n in range(1, 5):
        host.start(f"r{n}", job=job, task_ms=20)
    ready = datetime.fromtimestamp(host.wait_ready(), UTC)
    # Ticks from the first whole second after all four were up: at least 20 of them, done.
    first = ready.replace(microsecond=0) + timedelta(seconds=2)

    def enough() -> list[Row] | None:
        done = [r for r in host.ledger(job) if r.tick >= first and r.outcome is not None]
        return done if len(done) >= 22 else None

    host.wait_until("22 ticks to be recorded", enough, timeout=60)
    codes = host.stop()
    assert codes == dict.fromkeys(("r1", "r2", "r3", "r4"), 0), codes

    ledger = [r for r in host.ledger(job) if r.tick >= first]
    last = max(r.tick for r in ledger)  # it may have met the shutdown: not counted
    expected = [first + timedelta(seconds=k) for k in range(round((last - first).total_seconds()))]
    window = [r for r in ledger if r.tick < last]
    assert [r.tick for r in window] == expected, "a tick is missing or recorded twice"
    assert Counter(r.outcome for r in window) == {"succeeded": len(expected)}

    started = [e for e in host.events() if e["event"] == "start" and e["job"] == job]
    ran = Counter(datetime.fromisoformat(e["tick"]) for e in started)
    duplicates = sum(count - 1 for count in ran.values())
    assert duplicates == 0, [tick for tick, count in ran.items() if count > 1]
    assert all(ran[tick] == 1 for tick in expected), "a tick did not run"
    by_tick = {datetime.fromisoformat(e["tick"]): e for e in started}
    for row in window:  # the ledger and the process that ran the tick agree
        assert (by_tick[row.tick]["replica"], by_tick[row.tick]["run_id"]) == (
            row.replica,
            row.run_id,
        )
    finished = Counter(e["tick"] for e in host.events() if e["event"] == "finish")
    assert sum(finished.values()) == len(started)
    # Nothing left open and no lock left held once all four are down.
    assert all(r.outcome is not None for r in host.ledger(job))
    assert lock_is_free(lock_file(host.state_dir, job))

    per_replica = Counter(by_tick[t]["replica"] for t in expected)
    summary(
        f"embedded once-per-tick: 4 processes, {len(expected)} ticks, "
        f"{len(started)} runs in all, {sum(ran[t] for t in expected)} runs in the window, "
        f"duplicates={duplicates}, by replica {dict(sorted(per_replica.items()))}"
    )


def test_kill_9_of_the_lock_holder_frees_the_job_at_once(
    host: Host, summary: Callable[[str], None]
) -> None:
    job = "slow"
    for n in range(1, 4):
        host.start(f"r{n}", job=job, task_ms=60_000, stop_timeout=2)
    host.wait_ready()
    path = lock_file(host.state_dir, job)

    def long_run() -> dict[str, Any] | None:
        runs = [e for e in host.events() if e["event"] == "start"]
        skipped = [r for r in host.ledger(job) if r.outcome == "skipped_overlap"]
        # A run that has kept the others out for at least two ticks.
        return runs[0] if len(runs) == 1 and len(skipped) >= 2 else None

    victim = host.wait_until("a long run to hold the job", long_run, timeout=30)
    assert not lock_is_free(path), "the running job's lock file is not locked"
    killed_tick = datetime.fromisoformat(victim["tick"])

    host.kill(victim["replica"])
    killed_at = time.monotonic()
    freed = lock_is_free(path)  # the kernel dropped the dead process's lock
    freed_ms = (time.monotonic() - killed_at) * 1000
    assert freed, "the killed process's file lock is still held"

    def next_run() -> dict[str, Any] | None:
        runs = [e for e in host.events() if e["event"] == "start"]
        later = [e for e in runs if datetime.fromisoformat(e["tick"]) > killed_tick]
        return later[0] if later else None

    successor = host.wait_until("the next tick to run elsewhere", next_run, timeout=15)
    took = time.monotonic() - killed_at
    assert successor["replica"] != victim["replica"]
    assert took < 5, f"the next run started {took:.1f} s after the kill"

    def abandoned() -> Row | None:
        [row] = [r for r in host.ledger(job) if r.tick == killed_tick]
        return row if row.outcome is not None else None

    row = host.wait_until("the killed run to be recorded", abandoned, timeout=10)
    assert row.outcome == "abandoned", row
    assert f"process {victim['pid']} " in (row.error or ""), row.error
    assert (row.replica, row.run_id) == (victim["replica"], victim["run_id"])

    # The successor holds the job now: the next ticks are skipped everywhere else.
    successor_tick = datetime.fromisoformat(successor["tick"])

    def skipped_after() -> bool:
        rows = host.ledger(job)
        return sum(r.tick > successor_tick and r.outcome == "skipped_overlap" for r in rows) >= 2

    host.wait_until("ticks after the handover to be skipped", skipped_after, timeout=15)
    codes = host.stop()
    assert set(codes.values()) == {0}, codes
    ledger = host.ledger(job)
    assert all(r.outcome is not None for r in ledger), [r for r in ledger if r.outcome is None]
    ran = sorted(
        (r for r in ledger if r.started_at is not None and r.outcome != "skipped_overlap"),
        key=lambda r: r.run_id,
    )
    assert [r.tick for r in ran] == [killed_tick, successor_tick]
    # Never two at once: the successor started once the killed run was recorded ended.
    assert ran[0].finished_at is not None
    assert ran[1].started_at is not None
    assert ran[1].started_at >= ran[0].finished_at, ran
    assert lock_is_free(path)
    summary(
        f"embedded kill -9: lock free {freed_ms:.1f} ms after the kill, next run "
        f"{took:.2f} s after it on {successor['replica']}, killed run '{row.outcome}', "
        f"{len(ledger)} ticks recorded, {len(ran)} runs, "
        f"{sum(r.outcome == 'skipped_overlap' for r in ledger)} skipped_overlap"
    )


def test_a_corrupt_state_file_stops_the_replica_with_one_line(
    host: Host, summary: Callable[[str], None]
) -> None:
    ledger = host.state_dir / LEDGER_NAME
    garbage = bytes(range(256)) * 64
    ledger.write_bytes(garbage)
    replica = host.start("r1", job="every1", task_ms=20)
    code = replica.wait_exit(30)
    lines = replica.log().splitlines()
    assert code == 2
    assert lines == [
        f"replica: error: replicron state {ledger}: is not a usable SQLite database:"
        " file is not a database"
    ]
    assert [e["event"] for e in host.events()] == ["failed"]  # it never got to run
    assert ledger.read_bytes() == garbage  # nothing written to it
    assert sorted(p.name for p in host.state_dir.iterdir()) == [LEDGER_NAME]
    summary(f"embedded corrupt state: exit {code}, {lines[0]}")


def test_leader_mode_kill_9_of_the_leader_hands_the_lease_on(
    host: Host, summary: Callable[[str], None]
) -> None:
    """Three processes in leader mode: only the leader runs the job; killed with SIGKILL, its
    lock file is free at once and a standby takes the lease at its next try (every second),
    then catches up the ticks that fell due meanwhile. Every tick has one row."""
    job = "led"
    for n in range(1, 4):
        host.start(f"r{n}", job=job, task_ms=20, leader=True)
    ready = datetime.fromtimestamp(host.wait_ready(), UTC)

    def gained(after: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in host.events() if e["event"] == "leader" and e["mono"] > after]

    [first] = host.wait_until("a leader", lambda: gained() or None, timeout=15)
    time.sleep(3)
    leader = host.current[str(first["replica"])]
    before = {e["pid"] for e in host.events() if e["event"] == "start"}
    assert before == {leader.pid}, "only the leader runs the job"
    host.kill(str(first["replica"]))
    killed = time.monotonic()
    [taken] = host.wait_until("a new leader", lambda: gained(killed) or None, timeout=15)
    takeover = float(taken["mono"]) - killed
    time.sleep(3)
    codes = host.stop()
    assert set(codes.values()) == {0}, codes
    successor = int(taken["pid"])
    after = {e["pid"] for e in host.events() if e["event"] == "start" and e["mono"] > taken["mono"]}
    assert after == {successor}, "only the new leader runs the job"
    ledger = [r for r in host.ledger(job) if r.tick > ready]
    ticks = [r.tick for r in ledger]
    last = max(ticks)
    expected = [
        ticks[0] + timedelta(seconds=k) for k in range(round((last - ticks[0]).seconds) + 1)
    ]
    assert ticks == expected, "a tick is missing or recorded twice"
    assert all(r.outcome is not None for r in ledger)
    started = Counter(e["tick"] for e in host.events() if e["event"] == "start")
    assert max(started.values()) == 1, "a tick ran twice"
    outcomes = Counter(r.outcome for r in ledger)
    summary(
        f"embedded leader mode: leader {first['replica']} killed, {taken['replica']} took "
        f"over in {takeover:.2f} s; {len(ledger)} ticks {dict(outcomes)}"
    )
    assert takeover < 1.0 + 2.0  # leader_retry, and a loaded host
