"""The daemon's fencing of a command job, with real processes and a real partition.

Two daemons (``python -m replicron run CONFIG``) share the suite's PostgreSQL: A inside the
network namespace, B on the host. Their one job runs a long command (``daemon_fencing/
worker.py``) whose program and grandchild, in the run's process group, both write a
time-stamped line every ~100 ms. Once A runs it, A is cut off both ways (nftables drops every
packet: only timeouts can tell). The daemon's promise: once A's runs lose their lease (a
heartbeat unanswered past its deadline, at the latest the lease's end, ``heartbeat_interval``
before ``stale_after``) it SIGKILLs the whole group, before any other replica may start the
job. So A's last line (program or
grandchild) comes before B's first; B takes the job over within a bound; the ledger records
A's run abandoned and no two runs of the job overlapping; A's daemon lives through it and,
once the partition heals, is ready again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests._harness.reporting import report_on_failure
from tests.faults.cluster import Database
from tests.faults.daemon_fencing.daemons import (
    WORKER,
    Daemons,
    Line,
    config_text,
    process_alive,
)
from tests.faults.netns import NetworkNamespace
from tests.faults.workdir import free_port

Summary = Callable[[str], None]
JOB = "fenced"
NAMESPACE = "fencing/"
HEARTBEAT, STALE = 1.0, 4.0  # the daemons' heartbeat_interval and stale_after (s)
LEASE = STALE - HEARTBEAT  # how long A's runs go on after its last heartbeat got through
EVERY_S = 2  # the job's interval
COMMAND_S = 90  # how long a run's program and grandchild write unless killed
A_HTTP = ("127.0.0.1", 18464)  # inside the namespace: nothing else listens there
TERMINAL = ("succeeded", "failed", "timed_out", "abandoned")  # outcomes of runs that ran


@pytest.fixture
def daemons(
    request: pytest.FixtureRequest, tmp_path: Path, netns: NetworkNamespace, db: Database
) -> Iterator[Daemons]:
    """The test's daemons; every one still running, and every command process left, is
    killed at the end (before the partition is healed and the database dropped)."""
    fleet = Daemons(tmp_path, tmp_path / "lines.jsonl")
    report_on_failure(request, "daemon logs", fleet.logs)
    try:
        yield fleet
    finally:
        fleet.close()


def daemon_config(dsn: str, replica_id: str, http: tuple[str, int], lines: Path) -> str:
    scheduler = {
        "database_url": dsn,
        "namespace": NAMESPACE,
        "replica_id": replica_id,
        "heartbeat_interval": f"{HEARTBEAT:g}s",
        "stale_after": f"{STALE:g}s",
        "stop_timeout": "1s",
        "http": f"{http[0]}:{http[1]}",
    }
    job = {
        "name": JOB,
        "every": f"{EVERY_S}s",
        "overlap": "skip",
        "command": [sys.executable, str(WORKER), str(lines), str(COMMAND_S)],
    }
    return config_text(scheduler, [job])


def ledger(db: Database) -> list[dict[str, Any]]:
    rows = db.rows(
        "SELECT run_id, replica_id, scheduled_at, started_at, finished_at, outcome, error"
        " FROM replicron_runs WHERE namespace = %s AND job = %s ORDER BY run_id",
        (NAMESPACE, JOB),
    )
    keys = ("run_id", "replica_id", "scheduled_at", "started_at", "finished_at", "outcome", "error")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def overlapping(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Pairs of runs of the job (rows that started and did not end skipped) whose spans in the
    ledger overlap; an unfinished run lasts until now."""
    ran = sorted(
        (r for r in rows if r["started_at"] is not None and r["outcome"] in (*TERMINAL, None)),
        key=lambda r: r["started_at"],
    )
    ends: list[tuple[int, datetime | None]] = []
    found = []
    for row in ran:
        for run_id, end in ends:
            if end is None or end > row["started_at"]:
                found.append((run_id, row["run_id"]))
        ends.append((row["run_id"], row["finished_at"]))
    return found


def of(lines: list[Line], replica: str, role: str | None = None) -> list[Line]:
    return [x for x in lines if x.replica == replica and (role is None or x.role == role)]


@pytest.mark.timeout(90)
def test_a_lost_lease_kills_the_command_group_before_another_replica_starts_it(
    daemons: Daemons, netns: NetworkNamespace, db: Database, tmp_path: Path, summary: Summary
) -> None:
    lines_path = tmp_path / "lines.jsonl"
    b_http = ("127.0.0.1", free_port())
    a_dsn = db.cluster.dsn(db.name, host=netns.host_address)  # only through the namespace link
    # ---- A runs the command (program + grandchild); B stands by ----------------------
    daemons.start(
        "a", daemon_config(a_dsn, "a", A_HTTP, lines_path), wrap=netns.command, where="namespace"
    )
    daemons.wait_http("a", "/readyz", 200, 30)

    def both_writing() -> list[Line] | None:
        lines = daemons.lines()
        mine = [of(lines, "a", "command"), of(lines, "a", "grandchild")]
        return lines if all(mine) else None

    first_a = of(
        daemons.wait_until("A's program and grandchild to write", both_writing, 3 * EVERY_S + 15),
        "a",
    )[0]
    daemons.start("b", daemon_config(db.dsn, "b", b_http, lines_path))
    daemons.wait_http("b", "/readyz", 200, 30)
    # A's run has heartbeated at least once: the lease that runs out is a renewed one.
    time.sleep(max(0.0, first_a.wall + HEARTBEAT + 1.0 - time.time()))
    assert of(daemons.lines(), "b") == [], "B ran the job while A was running it"

    # ---- the cut, and the takeover -------------------------------------------------
    netns.partition()
    cut = time.time()
    a_statuses: set[int] = set()  # A's /readyz while it is cut off

    def b_started() -> Line | None:
        a_statuses.add(daemons.http_status("a", "/readyz"))
        found = of(daemons.lines(), "b")
        return found[0] if found else None

    first_b = daemons.wait_until("B to take the job over", b_started, STALE + 20, 0.1)
    # Whatever A's group would still write shows up by now (lines come every 0.1 s).
    time.sleep(1.0)
    lines = daemons.lines()
    a_lines, b_lines = of(lines, "a"), of(lines, "b")
    last_a = a_lines[-1]
    a_pids = {x.pid for x in a_lines}
    a_runs, b_runs = {x.run_id for x in a_lines}, {x.run_id for x in b_lines}
    a_alive_after = [pid for pid in a_pids if process_alive(pid)]
    a_statuses.add(daemons.http_status("a", "/readyz"))
    gap = first_b.wall - last_a.wall
    fencing = (
        f"A's group (program + grandchild, {len(a_pids)} pids) last wrote "
        f"{last_a.wall - cut:.2f} s after the cut, B's command first wrote "
        f"{first_b.wall - cut:.2f} s after it: gap {gap:.2f} s"
    )
    print(fencing)
    # Both of A's processes wrote, in one group, for one run; then one run of B.
    assert {x.role for x in a_lines} == {"command", "grandchild"}
    assert len(a_pids) == 2, a_pids
    assert {x.pgid for x in a_lines} == {last_a.pgid}, "A's two processes in two groups"
    assert len(a_runs) == 1, a_runs
    assert len(b_runs) == 1, b_runs
    assert b_runs.isdisjoint(a_runs), (a_runs, b_runs)
    # The promise: A's whole process group was gone before B's command started.
    assert gap > 0, f"A's group wrote {-gap:.2f} s after B's command started: two at once"
    assert a_alive_after == [], f"A's command processes alive after B took over: {a_pids}"
    # Within its lease (from its last heartbeat, at most one interval before the cut) and
    # a little: SIGKILL needs no cooperation, and a line comes every 0.1 s.
    assert last_a.wall - cut < LEASE + 1.0
    # B takes over once A's row is stale and the server has dropped A's session (its
    # keepalives give up about stale_after after its last statement), at the next tick.
    assert first_b.wall - cut < STALE + 4 * HEARTBEAT + EVERY_S + 4
    # A's daemon is alive, and no longer ready: it holds no lock session.
    daemons.check_alive()
    assert 503 in a_statuses, f"A's /readyz while cut off: {sorted(a_statuses)}"

    # ---- the heal: A records its run and comes back --------------------------------
    netns.heal()
    healed, healed_db = time.time(), db.now()
    [a_run] = a_runs
    # A reconnects and writes its run's outcome (or B's janitor wrote it off before).
    a_row = db.wait_until(
        "A's run to be recorded",
        lambda: next(
            (r for r in ledger(db) if str(r["run_id"]) == a_run and r["outcome"] is not None), None
        ),
        30,
    )
    ready_again = daemons.wait_http("a", "/readyz", 200, 40) - healed
    # ... and heartbeats again, on a new lock session.
    daemons.wait_until(
        "A to heartbeat again",
        lambda: db.rows(
            "SELECT 1 FROM replicron_replicas WHERE namespace = %s AND replica_id = 'a'"
            " AND last_seen > %s AND stopped_at IS NULL",
            (NAMESPACE, healed_db),
        ),
        30,
    )
    heartbeat_again = time.time() - healed
    later_a = [x for x in of(daemons.lines(), "a") if x.wall > last_a.wall]
    a_log = daemons["a"].log()
    b_running = next(r for r in ledger(db) if str(r["run_id"]) in b_runs)
    codes = daemons.stop(["a", "b"])
    leftovers = daemons.leftovers()
    # Read once both are down: every row has its outcome then. (A claim that wants the
    # lock inserts its row as started, and the claimant records it skipped_overlap at
    # once when the lock is refused: an earlier read may catch such a row still open.)
    rows = ledger(db)
    ran = [r for r in rows if r["outcome"] in TERMINAL]

    summary(
        f"[daemon A cut off both ways mid-command, heartbeat {HEARTBEAT:g} s, stale_after "
        f"{STALE:g} s] {fencing}; A's row {a_row['outcome']!r} ({a_row['error']}); A's "
        f"/readyz while cut off {sorted(a_statuses)}, 200 again {ready_again:.1f} s after "
        f"the heal, heartbeating again {heartbeat_again:.1f} s after it; runs in the ledger "
        f"{[(r['replica_id'], r['outcome']) for r in ran]}, ticks "
        f"{len(rows)}; exit={codes}"
    )
    assert later_a == [], f"A's group wrote again after its last line: {later_a[:3]}"
    assert "killing its process group" in a_log, "A's daemon did not say it killed the group"
    # The ledger: A's run abandoned; B's run is the one that started after it; no two runs
    # of the job at once, and no other run at all (the ticks meanwhile were skipped).
    assert a_row["outcome"] == "abandoned", a_row
    assert a_row["replica_id"] == "a"
    assert b_running["replica_id"] == "b"
    assert b_running["outcome"] is None, "B's run was over before B was stopped"
    assert b_running["started_at"] is not None
    assert a_row["finished_at"] <= b_running["started_at"], (a_row, b_running)
    assert [r for r in rows if r["outcome"] is None] == [], "rows left open"
    assert {str(r["run_id"]) for r in ran} == a_runs | b_runs, ran
    assert overlapping(rows) == [], ran
    # A's daemon lived through it all and stopped cleanly, as did B; nothing is left.
    assert codes == {"a": 0, "b": 0}
    assert leftovers == [], f"command processes left running: {leftovers}"
