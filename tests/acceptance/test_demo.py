"""``replicron demo`` end to end: the README's main command, run as a user runs it.

Each case starts ``python -m replicron.cli demo --seconds 6`` (three real replica processes on
one backend) and checks the command's own verdict: exit status 0, every tick line
``ran=1 skipped=2``, ``duplicates=0 misses=0``, and that nothing is left behind (temporary
directory, replica sessions and locks in PostgreSQL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers import REPO

REPLICAS = 3
SECONDS = 6
TIME = re.compile(r"^\d\d:\d\d:\d\d  ")
TICK = re.compile(
    r"^\d\d:\d\d:\d\d  (?P<job>\S+) +(?P<what>.+?) +ran=(?P<ran>\d+) skipped=(?P<sk>\d+)$"
)
SUMMARY = re.compile(r"^summary: (\d+) ticks, (\d+) runs, duplicates=(\d+) misses=(\d+)$")


def demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the demo with its temporary directory under ``tmp_path``."""
    return subprocess.run(
        [sys.executable, "-m", "replicron.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )


def check_verdict(result: subprocess.CompletedProcess[str], backend: str) -> None:
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    assert result.stderr == ""
    lines = out.splitlines()
    ticks = [TICK.match(line) for line in lines if TIME.match(line)]
    assert all(ticks), out
    jobs = Counter(m.group("job") for m in ticks if m)
    # A 6 s window that starts on a whole second: 6 heartbeats (1 s) and 2 reports (3 s).
    assert jobs == {"heartbeat": SECONDS, "report": SECONDS // 3}, out
    for m in ticks:
        assert m is not None
        assert (m["ran"], m["sk"]) == ("1", str(REPLICAS - 1)), m.group(0)
        assert re.fullmatch(r"ran on replica-\d \(run \d+, -?\d+ ms late\)", m["what"]), m[0]
    [summary] = [m for m in map(SUMMARY.match, lines) if m]
    assert summary.groups() == (str(len(ticks)), str(len(ticks)), "0", "0"), out
    [per_replica] = [line for line in lines if line.startswith("  runs per replica: ")]
    counts = dict(item.split("=") for item in per_replica.split(": ")[1].split())
    assert sorted(counts) == [f"replica-{i}" for i in range(1, REPLICAS + 1)]
    assert sum(map(int, counts.values())) == len(ticks)
    assert any(line.startswith(f"  backend: {backend}") for line in lines), out
    assert lines[-1] == f"OK: every tick ran exactly once across {REPLICAS} replicas"


def replica_sessions(conn: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    """(how many sessions of replicas, application_name "replicron ...", are still open)"""
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'replicron %'"
    ).fetchone()


def left_behind(tmp_path: Path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if p.name.startswith("replicron-demo-")]


@pytest.mark.timeout(90)
def test_demo_on_the_embedded_backend(tmp_path: Path) -> None:
    result = demo(tmp_path, "--seconds", str(SECONDS))
    check_verdict(result, "embedded")
    assert left_behind(tmp_path) == []


@pytest.mark.timeout(90)
def test_demo_on_postgresql(tmp_path: Path, dsn: str) -> None:
    result = demo(tmp_path, "--seconds", str(SECONDS), "--database-url", dsn)
    check_verdict(result, "PostgreSQL")
    assert left_behind(tmp_path) == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        sessions = replica_sessions(conn)
        locks = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database ="
            " (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        namespaces = conn.execute(
            "SELECT count(DISTINCT namespace) FROM replicron_runs WHERE namespace LIKE 'demo-%'"
        ).fetchone()
    assert (sessions, locks) == ((0,), (0,))
    assert namespaces == (1,)


@pytest.mark.timeout(90)
def test_ctrl_c_stops_the_replicas_and_removes_the_directory(tmp_path: Path, dsn: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "replicron.cli", "demo", "--seconds", "60", "--database-url", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the first tick line: replicas up and reporting
            seen.append(line)
            if TIME.match(line):
                break
        assert seen, "no output"
        assert TIME.match(seen[-1]), "".join(seen)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert err == "replicron: interrupted; stopping the replicas\n"
    assert left_behind(tmp_path) == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = replica_sessions(conn)
    assert row == (0,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas must be between 1 and 32, got 0"),
        (["--seconds", "0.5"], "--seconds must be between 1 and 3600, got 0.5"),
        (
            ["--database-url", "mysql://u:secret@h/db"],
            "--database-url must be a PostgreSQL URL (postgresql://...) or libpq key=value "
            "string, got 'mysql://u:***@h/db'",
        ),
        (["--seconds", "x"], "argument --seconds: invalid float value: 'x'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = demo(tmp_path, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.endswith(f"error: {message}\n")
    assert result.stderr.count("\n") == 1
    assert left_behind(tmp_path) == []
