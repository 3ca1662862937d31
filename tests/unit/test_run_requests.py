"""Manual runs asked for across the replicas of an embedded state directory (``replicron
run-now``, a real process): whichever replica polls first runs it, once."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from replicron import EmbeddedBackend, Scheduler, every
from replicron.backends.base import Backend
from replicron.backends.embedded import LEDGER_NAME
from replicron.testing import FakeClock
from tests.helpers import embedded_rows, poll_until, run_cli, z

START = z(2026, 1, 1)


def replicas_of_report(backends: list[Backend]) -> tuple[list[Scheduler], list[str]]:
    """Started schedulers, one per backend, each with the hourly job "report", and the
    replicas that ran it, in order."""
    clock = FakeClock(START)
    ran: list[str] = []
    lock = threading.Lock()
    replicas = []
    for n, backend in enumerate(backends, 1):
        s = Scheduler(clock=clock, backend=backend, replica_id=f"node-{n}")

        def report(replica: str = f"node-{n}") -> None:
            with lock:
                ran.append(replica)

        s.add_job(every(hours=1), report, name="report")
        replicas.append(s)
    for s in replicas:
        s.start()
    return replicas, ran


def test_a_run_asked_for_runs_once_on_one_of_two_replicas(tmp_path: Path) -> None:
    replicas, ran = replicas_of_report([EmbeddedBackend(tmp_path), EmbeddedBackend(tmp_path)])
    try:
        unknown = run_cli("run-now", "nope", "--state-dir", str(tmp_path))
        assert unknown.returncode == 2
        assert "no replica has registered a job named 'nope'" in unknown.stderr

        asked = run_cli("run-now", "report", "--state-dir", str(tmp_path))
        assert asked.returncode == 0, asked.stderr
        assert asked.stdout.startswith("asked for a run of 'report' at ")
        poll_until("the run asked for", lambda: len(ran) >= 1, timeout=30)
    finally:
        for s in replicas:
            s.shutdown()
    assert len(ran) == 1
    rows = embedded_rows(tmp_path, "report")
    assert [(row["manual"], row["outcome"]) for row in rows] == [(1, "succeeded")]
    assert rows[0]["replica_id"] == ran[0]


def test_old_requests_are_dropped_and_not_run(tmp_path: Path) -> None:
    clock = FakeClock(START)
    ran: list[int] = []
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="node-1")
    s.add_job(every(hours=1), lambda: ran.append(1), name="report")
    outsider = EmbeddedBackend(tmp_path)  # never opened, as the CLI's
    with s:
        asyncio.run(outsider.request_run("report", "test"))
        poll_until("the run asked for", lambda: len(ran) >= 1, timeout=30)
    conn = sqlite3.connect(tmp_path / LEDGER_NAME)
    with conn:  # as if asked for an hour ago, and never run
        conn.execute("DELETE FROM replicron_runs WHERE manual = 1")
        conn.execute(
            "UPDATE replicron_run_requests SET requested_at = requested_at - ?",
            [int(timedelta(hours=1) / timedelta(microseconds=1))],
        )
    with Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="node-2") as s2:
        s2.add_job(every(hours=1), lambda: ran.append(2), name="report")
        asyncio.run(outsider.request_run("report", "test"))  # drops the old one
        poll_until("the new run asked for", lambda: len(ran) == 2, timeout=30)
    [(count,)] = conn.execute("SELECT count(*) FROM replicron_run_requests").fetchall()
    conn.close()
    assert count == 1
    assert ran == [1, 2]  # the old request was not run again


class StaleReads(EmbeddedBackend):
    """Reads the requests as a replica whose read raced another's claim: still pending."""

    def __init__(self, state_dir: Path, stale: list[tuple[str, datetime]]) -> None:
        super().__init__(state_dir)
        self.stale, self.polls = stale, 0

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        self.polls += 1
        return list(self.stale)


def test_a_request_another_replica_ran_is_done_not_asked_again(tmp_path: Path) -> None:
    clock = FakeClock(START)
    ran: list[str] = []
    first = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="node-1")
    first.add_job(every(hours=1), lambda: ran.append("node-1"), name="report")
    with first:
        asyncio.run(EmbeddedBackend(tmp_path).request_run("report", "test"))
        poll_until("the run asked for", lambda: len(ran) >= 1, timeout=30)
    conn = sqlite3.connect(tmp_path / LEDGER_NAME)
    [(requested,)] = conn.execute("SELECT requested_at FROM replicron_run_requests").fetchall()
    conn.close()
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=requested)
    stale = StaleReads(tmp_path, [("report", at)])
    late = Scheduler(clock=clock, backend=stale, replica_id="node-2")
    late.add_job(every(hours=1), lambda: ran.append("node-2"), name="report")
    with late:  # its claim finds the run recorded: the request is done
        poll_until("three polls", lambda: stale.polls >= 3, timeout=30)
    assert ran == ["node-1"]
    assert [row["manual"] for row in embedded_rows(tmp_path, "report")] == [1]


def test_a_request_is_not_run_again_once_retention_passed_over_its_row(tmp_path: Path) -> None:
    """A retention shorter than a request's life: the janitor (at a replica's start) keeps
    the manual run's row while the request is young, though a later tick was recorded, so
    the new replica does not run it again."""
    now = datetime.now(UTC)
    clock = FakeClock(now.replace(minute=0, second=0, microsecond=0))  # the wall clock's hour
    ran: list[str] = []
    retention = timedelta(milliseconds=200)
    first = Scheduler(
        clock=clock, backend=EmbeddedBackend(tmp_path, retention=retention), replica_id="node-1"
    )
    first.add_job(every(hours=1), lambda: ran.append("node-1"), name="report")
    with first:
        asyncio.run(EmbeddedBackend(tmp_path).request_run("report", "test"))
        poll_until("the run asked for", lambda: len(ran) >= 1, timeout=30)
        clock.advance(timedelta(hours=1))  # a tick after the manual run
        first.wait_idle()
    time.sleep(0.5)  # real time: the rows' claims are older than the retention
    late = EmbeddedBackend(tmp_path, retention=retention)
    second = Scheduler(clock=clock, backend=late, replica_id="node-2")
    second.add_job(every(hours=1), lambda: ran.append("node-2"), name="report")
    with second:  # its janitor ran at its start; it polls for requests at once
        time.sleep(0.5)
        second.wait_idle()
    assert ran == ["node-1", "node-1"]
    assert sorted(row["manual"] for row in embedded_rows(tmp_path, "report")) == [0, 1]
