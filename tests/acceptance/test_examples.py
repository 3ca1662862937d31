"""The example services under examples/, run as their README says, as real processes."""

from __future__ import annotations

import functools
import itertools
import json
import re
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from tests._harness.processes import Child, Processes, clean_env

pytest.importorskip("fastapi")

_TICK = re.compile(r"refresh-rates tick (\S+) run (\d+)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()
    except OSError:
        return 0, b""


def _healthy(port: int) -> bool:
    return _get(port, "/healthz")[0] == 200


def _ticks(children: list[Child]) -> list[datetime]:
    return [
        datetime.fromisoformat(found.group(1))
        for child in children
        for found in _TICK.finditer(child.log())
    ]


def _uvicorn(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "examples.fastapi.app:app", "--port", str(port)]


def _stopped_cleanly(child: Child) -> None:
    # uvicorn raises SIGTERM again once its shutdown is complete.
    assert child.wait_exit(30) in (0, -signal.SIGTERM), child.tail()
    assert "Application shutdown complete" in child.log(), child.tail()


def _check_chain(ticks: list[datetime]) -> None:
    """Each tick ran once, and none between the first and the last was skipped."""
    repeated = [tick for tick, count in Counter(ticks).items() if count > 1]
    assert not repeated, f"ticks run twice: {repeated}"
    ordered = sorted(ticks)
    gaps = [b for a, b in itertools.pairwise(ordered) if b - a != timedelta(seconds=2)]
    assert not gaps, f"ticks missing before {gaps}"


def test_fastapi_example_on_postgresql_runs_each_tick_once(tmp_path: Path, dsn: str) -> None:
    processes = Processes(tmp_path)
    ports = [_free_port() for _ in range(3)]
    env = {**clean_env(), "DATABASE_URL": dsn}
    children = [
        processes.spawn(f"app-{i}", _uvicorn(port), env=env) for i, port in enumerate(ports)
    ]
    try:
        for port in ports:
            processes.wait_until(f"/healthz on {port}", functools.partial(_healthy, port), 30)
        processes.wait_until("5 ticks run", lambda: len(_ticks(children)) >= 5, 30)
        status, body = _get(ports[0], "/jobs/status.json")
        assert status == 200
        assert "refresh-rates" in json.dumps(json.loads(body))
        assert _get(ports[1], "/rates")[0] == 200
        for child in children:
            child.signal(signal.SIGTERM)
        for child in children:
            _stopped_cleanly(child)
    finally:
        processes.close()
    _check_chain(_ticks(children))
    run_ids = [int(found.group(2)) for c in children for found in _TICK.finditer(c.log())]
    assert len(set(run_ids)) == len(run_ids)
    with psycopg.connect(dsn) as conn:
        open_rows = conn.execute(
            "SELECT count(*) FROM replicron_runs WHERE outcome IS NULL"
        ).fetchone()
    assert open_rows == (0,), "a stopped replica left a run open"


def test_fastapi_example_with_uvicorn_workers_on_one_host(tmp_path: Path) -> None:
    processes = Processes(tmp_path)
    port = _free_port()
    env = {**clean_env(), "REPLICRON_STATE_DIR": str(tmp_path / "state")}
    server = processes.spawn("uvicorn", [*_uvicorn(port), "--workers", "3"], env=env)
    try:
        processes.wait_until(
            "3 workers up", lambda: server.log().count("Application startup complete") >= 3, 30
        )
        processes.wait_until("5 ticks run", lambda: len(_ticks([server])) >= 5, 30)
        # The job ran in one worker; uvicorn spreads requests over all three.
        answers = [_get(port, "/rates") for _ in range(12)]
        assert [status for status, _ in answers] == [200] * 12
        empty = [body for _, body in answers if not json.loads(body)]
        assert not empty, f"{len(empty)} of 12 requests got no rates"
        server.signal(signal.SIGTERM)
        _stopped_cleanly(server)
    finally:
        processes.close()
    _check_chain(_ticks([server]))
    pids = set(re.findall(r"Started server process \[(\d+)\]", server.log()))
    assert len(pids) == 3, server.tail()
