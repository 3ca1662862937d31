"""PostgreSQL coordination cost: round trips per run, connections per replica, claim rate.

    .venv/bin/python bench/pg_coordination.py [--dsn postgresql://postgres@127.0.0.1/test]

Runs in a fresh database created for the run and dropped after it:

1. Three replicas (schedulers with PostgresBackend in this process, each with its own lock
   session) share 200 async jobs firing every 2 s whose task takes 1 s, so ~200 runs are
   going at once. Counted on the client: statements each replica's lock session sends,
   split into per-run traffic (claims, releases) and background traffic (heartbeats,
   janitor); counted on the server: connections per replica in pg_stat_activity.
2. Claim throughput on loopback: one handle claiming and releasing 20,000 ticks in batches
   of 1 and of 100 (the engine batches the ticks due at one instant, and the releases that
   pile up while one is under way).

Targets: <= 2 round trips per coordinated run, <= 2 connections per replica. Exits 1 if a
target is missed (unless --no-check).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import replicron
from replicron.backends import ClaimRequest, Release, RunRecord
from replicron.postgres import PostgresBackend
from replicron.postgres._session import LockSession
from replicron.postgres._sql import queries

JOBS = 200
PERIOD = 2.0
TASK_SECONDS = 1.0
WINDOW = 12.0


def count_statements() -> Counter[str]:
    """Count what every lock session sends, by query name (wraps LockSession.fetch)."""
    names = {text: name for name, text in queries().items()}
    counts: Counter[str] = Counter()
    original = LockSession.fetch

    async def counting(
        self: LockSession, query: str, params: Mapping[str, Any], *, retry: bool = False
    ) -> list[tuple[Any, ...]]:
        counts[names.get(query, "other")] += 1
        return await original(self, query, params, retry=retry)

    LockSession.fetch = counting  # type: ignore[method-assign]
    return counts


async def replicas_scenario(dsn: str, counts: Counter[str]) -> dict[str, float]:
    runs = 0
    peak = 0
    running = 0

    async def task() -> None:
        nonlocal runs, running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(TASK_SECONDS)
        running -= 1
        runs += 1

    schedulers = [
        replicron.AsyncScheduler(backend=PostgresBackend(dsn), replica_id=f"bench-{i}")
        for i in range(3)
    ]
    for scheduler in schedulers:
        await scheduler.start()
        for j in range(JOBS):
            scheduler.add_job(replicron.every(seconds=PERIOD), task, name=f"job-{j:03d}")
    counts.clear()
    runs_before = runs
    await asyncio.sleep(WINDOW)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'replicron %'"
            " GROUP BY application_name"
        ).fetchall()
    seen = Counter(counts)  # a snapshot: shutdown sends more
    finished_runs = runs - runs_before
    for scheduler in schedulers:
        await scheduler.shutdown()
    per_run = seen["claim"] + seen["release"] + seen["lock"] + seen["record_unclaimed"]
    background = sum(seen.values()) - per_run
    print("statements in the window:", dict(sorted(seen.items())))
    return {
        "runs": finished_runs,
        "peak_concurrent_runs": peak,
        "round_trips_per_run": per_run / max(finished_runs, 1),
        "background_round_trips_per_s": background / WINDOW,
        "connections_per_replica": max((n for _, n in rows), default=0),
        "replicas_seen": len(rows),
    }


async def claim_rate(dsn: str, batch: int, total: int) -> float:
    backend = PostgresBackend(dsn)
    await backend.open("bench-claims")
    base = datetime(2020, 1, 1, tzinfo=UTC)  # due long ago: claims are refused before their tick
    started = time.perf_counter()
    for offset in range(0, total, batch):
        requests = [
            ClaimRequest(f"rate-{batch}", base + timedelta(seconds=offset + i), lock=False)
            for i in range(batch)
        ]
        claims = await backend.claim(requests)
        ended = [
            RunRecord(
                c.job,
                c.scheduled_at,
                replicron.Outcome.SUCCEEDED,
                "bench",
                c.run_id,
                None,
                None,
                None,
            )
            for c in claims
        ]
        await backend.release([Release(record, False) for record in ended])
    elapsed = time.perf_counter() - started
    await backend.close()
    return total / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("REPLICRON_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    name = f"replicron_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(args.dsn, dbname=name)
    try:
        counts = count_statements()
        result = asyncio.run(replicas_scenario(dsn, counts))
        rates = {b: asyncio.run(claim_rate(dsn, b, 20_000 if b > 1 else 4_000)) for b in (1, 100)}
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    print(
        f"3 replicas, {JOBS} async jobs every {PERIOD:g} s taking {TASK_SECONDS:g} s, "
        f"{WINDOW:g} s window"
    )
    for key, value in result.items():
        print(f"  {key:32} {value:10.2f}")
    print("claim + release on loopback (one handle)")
    for batch, rate in rates.items():
        print(f"  batch {batch:<4} ticks/s {rate:10.0f}")
    checks = {
        "round trips per run <= 2": result["round_trips_per_run"] <= 2,
        "connections per replica <= 2": result["connections_per_replica"] <= 2,
    }
    for target, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {target}")
    return 1 if not all(checks.values()) and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
