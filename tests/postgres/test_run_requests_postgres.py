"""Manual runs asked for across the cluster on PostgreSQL, in both coordination modes: two
replicas poll for the request, one runs it, the ledger holds one manual row."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from replicron.backends.base import Backend
from replicron.errors import JobNotFoundError
from replicron.postgres import CoordinationMode, PostgresBackend
from tests.helpers import poll_until, run_cli
from tests.postgres.test_postgres_backend import sql
from tests.unit.test_run_requests import replicas_of_report


@pytest.mark.parametrize("mode", ["advisory", "lease"])
def test_a_run_asked_for_runs_once_across_replicas(dsn: str, mode: CoordinationMode) -> None:
    replicas, ran = replicas_of_report(
        [PostgresBackend(dsn, namespace="app/", coordination=mode) for _ in (1, 2)]
    )
    try:
        outsider = PostgresBackend(dsn, namespace="app/", migrate=False)
        with pytest.raises(JobNotFoundError, match="'nope' in namespace 'app/'"):
            asyncio.run(outsider.request_run("nope", "test"))
        asked = run_cli("run-now", "report", "--database-url", dsn, "--namespace", "app/")
        assert asked.returncode == 0, asked.stderr
        poll_until("the run asked for", lambda: len(ran) >= 1, timeout=30)
    finally:
        for s in replicas:
            s.shutdown()
    assert len(ran) == 1
    rows = sql(dsn, "SELECT manual, outcome, replica_id FROM replicron_runs WHERE job = 'report'")
    assert rows == [(True, "succeeded", ran[0])]


@pytest.mark.timeout(120)
def test_a_run_asked_for_runs_once_though_its_row_is_pruned(dsn: str) -> None:
    """A retention shorter than a request's life: the janitor keeps the manual run's row
    while the request is young, so no replica takes the request for a new one."""
    backends: list[Backend] = [
        PostgresBackend(
            dsn, namespace="short/", heartbeat_interval=0.1, retention=timedelta(seconds=1)
        )
        for _ in (1, 2)
    ]
    replicas, ran = replicas_of_report(backends)
    try:
        asyncio.run(
            PostgresBackend(dsn, namespace="short/", migrate=False).request_run("report", "t")
        )
        poll_until("the run asked for", lambda: len(ran) >= 1, timeout=30)
        # Past the retention, through several janitor rounds (every 12 heartbeats) and
        # polls of the requests (every 2 s).
        time.sleep(8.0)
        rows = sql(dsn, "SELECT manual FROM replicron_runs WHERE namespace = 'short/'")
    finally:
        for s in replicas:
            s.shutdown()
    assert len(ran) == 1, ran
    assert rows == [(True,)]  # kept while the request may be pending
