"""The daemon's graceful stop with command jobs going on, as real processes: SIGTERM to the
daemon gives each run until ``stop_timeout``; a command still going gets SIGTERM its
``kill_grace`` before that deadline, SIGKILL at it; its run is recorded ``abandoned`` once its
process group is gone, its lock released; the daemon exits within ``stop_timeout`` + 1 s.

Two programs (``daemon_scripts/stop_aware.py``) with a grandchild that ignores SIGTERM: one
traps SIGTERM and cleans up, one ignores it. Times are ``time.monotonic()``, read by the
programs and by the test alike; the bounds are generous (a shared machine).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests._harness.daemons import Daemons, config_text
from tests.helpers import embedded_rows, poll_until

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc is read"),
]

SCRIPT = Path(__file__).resolve().parent / "daemon_scripts" / "stop_aware.py"
STOP_TIMEOUT, KILL_GRACE = 3.0, 1.0
TERM_AT = STOP_TIMEOUT - KILL_GRACE  # seconds after the daemon's SIGTERM
JOBS = ("trap", "ignore")


def events(path: Path) -> dict[str, dict[str, Any]]:
    """What a program said, by event (the last of each)."""
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return {line["event"]: line for line in lines}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False


@pytest.mark.parametrize("backend", ["embedded", "advisory", "lease"])
def test_sigterm_stops_command_runs_by_the_stop_timeout(
    daemons: Daemons,
    request: pytest.FixtureRequest,
    backend: str,
    summary: Callable[[str], None],
) -> None:
    namespace = f"stop-{uuid.uuid4().hex[:8]}"
    dsn = None
    if backend == "embedded":
        settings: dict[str, object] = {"state_dir": str(daemons.workdir / "state")}
    else:
        dsn = request.getfixturevalue("dsn")
        settings = {"database_url": dsn, "namespace": namespace, "coordination": backend}
    settings |= {"replica_id": "solo", "stop_timeout": f"{STOP_TIMEOUT:g}s"}
    said = {job: daemons.workdir / f"{job}.jsonl" for job in JOBS}
    jobs = [
        {
            "name": job,
            "every": "1s",
            "max_runs": 1,
            "kill_grace": f"{KILL_GRACE:g}s",
            "command": [sys.executable, str(SCRIPT), str(said[job]), job],
        }
        for job in JOBS
    ]
    daemon = daemons.start("solo", config_text(settings, jobs))
    poll_until("both to start", lambda: all("started" in events(said[j]) for j in JOBS), 30)
    started = {job: events(said[job])["started"] for job in JOBS}
    processes = {job: (started[job]["pid"], started[job]["child"]) for job in JOBS}

    # SIGTERM; then watch the processes (the last instant each job's group was seen alive,
    # on both clocks) until the daemon and the groups are gone.
    daemon.terminate()
    sent = time.monotonic()
    last_seen = {job: (sent, time.time()) for job in JOBS}
    program_died: dict[str, float] = {}
    exited = None
    while time.monotonic() - sent < 20:
        now = time.monotonic()
        for job, (program, grandchild) in processes.items():
            if alive(grandchild) or alive(program):
                last_seen[job] = (now, time.time())
            if job not in program_died and not alive(program):
                program_died[job] = now
        if exited is None and daemon.proc.poll() is not None:
            exited = now
        if (
            exited is not None
            and len(program_died) == len(JOBS)
            and all(not alive(pid) for pair in processes.values() for pid in pair)
        ):
            break
        time.sleep(0.005)
    code = daemon.reap(10)
    assert code == 0, daemon.log()
    assert exited is not None
    took = exited - sent
    assert took <= STOP_TIMEOUT + 1.0, took

    # Both got SIGTERM kill_grace before the deadline.
    trap, ignore = events(said["trap"]), events(said["ignore"])
    for job, said_by in (("trap", trap), ("ignore", ignore)):
        assert "term" in said_by, (job, daemon.log())
        term = said_by["term"]["t"] - sent
        assert TERM_AT - 0.2 <= term <= TERM_AT + 0.8, (job, term)
    # The one that traps it cleaned up and exited; its group went with it.
    assert "cleaned" in trap
    assert program_died["trap"] - trap["cleaned"]["t"] < 0.5
    assert last_seen["trap"][0] - trap["cleaned"]["t"] < 0.5
    # The one that ignores it was killed at the deadline, with its grandchild.
    killed = last_seen["ignore"][0] - sent
    assert STOP_TIMEOUT - 0.2 <= killed <= STOP_TIMEOUT + 0.8, killed
    assert program_died["ignore"] - sent >= STOP_TIMEOUT - 0.2

    # Each run is recorded abandoned, saying how it ended, once its group was gone.
    rows = ledger(settings, dsn, namespace)
    for job, how in (("trap", "SIGTERM at stop; exit status 0"), ("ignore", "SIGKILL")):
        [row] = rows[job]
        assert row["outcome"] == "abandoned", row
        assert "shut down" in row["error"], row
        assert how in row["error"], row
        finished = row["finished_at"].timestamp()
        assert finished >= last_seen[job][1] - 0.05, (job, finished - last_seen[job][1])
    assert len(daemon.lines("the scheduler is stopping: sent SIGTERM")) == 2, daemon.log()
    assert len(daemon.lines("still running when the stop's time ran out")) == 1

    # No lock is left.
    if dsn is not None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            locks = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            held = conn.execute(
                "SELECT count(*) FROM replicron_job_locks WHERE namespace = %s"
                " AND run_id IS NOT NULL",
                (namespace,),
            ).fetchone()
        assert (locks, held) == ((0,), (0,))
    terms = ", ".join(f"{said_by['term']['t'] - sent:.2f}" for said_by in (trap, ignore))
    summary(
        f"{backend}: stop_timeout {STOP_TIMEOUT:g} s, kill_grace {KILL_GRACE:g} s: SIGTERM at "
        f"{terms} s, the trapping one done at {program_died['trap'] - sent:.2f} s, the other "
        f"SIGKILLed at {killed:.2f} s; the daemon exited at {took:.2f} s; both abandoned"
    )


def ledger(
    settings: dict[str, object], dsn: str | None, namespace: str
) -> dict[str, list[dict[str, Any]]]:
    """Each job's rows that ran."""
    found: dict[str, list[dict[str, Any]]] = {}
    for job in JOBS:
        if dsn is None:
            rows = embedded_rows(Path(str(settings["state_dir"])), job)
        else:
            with psycopg.connect(dsn, autocommit=True) as conn:
                cursor = conn.execute(
                    "SELECT outcome, error, finished_at FROM replicron_runs"
                    " WHERE namespace = %s AND job = %s AND started_at IS NOT NULL",
                    (namespace, job),
                )
                names = [c.name for c in cursor.description or []]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        found[job] = [
            {**row, "finished_at": _aware(row["finished_at"])}
            for row in rows
            if row["outcome"] != "skipped_overlap"
        ]
    return found


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
