"""Many runs going at once on one replica: where advisory mode meets PostgreSQL's shared lock
table, and lease mode does not.

    .venv/bin/python bench/pg_many_running.py --dsn postgresql://postgres@127.0.0.1/test
    .venv/bin/python bench/pg_many_running.py --dsn URL --jobs 20000 --hold 4

In each mode, on a fresh database of the server ``--dsn`` names (its lock table is what is
measured: ``max_locks_per_transaction`` x ``max_connections``, printed), one
``AsyncScheduler`` registers ``--jobs`` async jobs, ``every(seconds=60)`` with the default
``overlap="skip"`` (so each run holds its job's lock), whose task sleeps ``--hold`` seconds.
At the next whole minute they all fall due together. Measured: the most runs going at once,
how long after the instant the last one started, the advisory locks held at the peak
(``pg_locks``), the tick's outcomes in the ledger once the scheduler has shut down, and what
the backend logged at WARNING and above (advisory mode past the lock table: "out of shared
memory", the session dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import psycopg

import replicron
from replicron.postgres import PostgresBackend, migrate


@dataclass
class Result:
    mode: str
    running_peak: int = 0
    started: int = 0
    last_start_s: float = math.nan
    locks_peak: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class Errors(logging.Handler):
    """Counts what the backend logged at WARNING and above, by its first words."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        words = "out of shared memory" if "shared memory" in message else message[:60]
        self.seen[f"{record.levelname} {words}"] += 1


async def measure(url: str, mode: str, jobs: int, hold: float) -> Result:
    result = Result(mode)
    running = 0
    instant = 0.0

    async def task() -> None:
        nonlocal running
        running += 1
        result.started += 1
        result.running_peak = max(result.running_peak, running)
        result.last_start_s = time.time() - instant
        try:
            await asyncio.sleep(hold)
        finally:
            running -= 1

    errors = Errors()
    logger = logging.getLogger("replicron")
    logger.addHandler(errors)
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # counted, not printed
    backend = PostgresBackend(url, migrate=False, coordination=mode)  # type: ignore[arg-type]
    scheduler = replicron.AsyncScheduler(backend=backend, replica_id=f"{mode}-1")
    for index in range(jobs):
        scheduler.add_job(replicron.every(seconds=60), task, name=f"job-{index:05d}")
    try:
        await scheduler.start()
        instant = math.ceil((time.time() + 5) / 60) * 60
        with psycopg.connect(url, autocommit=True) as conn:
            while time.time() < instant + hold + 5:
                if time.time() >= instant - 0.5:
                    [(locks,)] = conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    ).fetchall()
                    result.locks_peak = max(result.locks_peak, int(locks))
                await asyncio.sleep(0.02)
    finally:
        await scheduler.shutdown()
        logger.removeHandler(errors)
    with psycopg.connect(url, autocommit=True) as conn:  # after the shutdown's last writes
        rows = conn.execute(
            "SELECT coalesce(outcome, 'open'), count(*) FROM replicron_runs"
            " WHERE scheduled_at = to_timestamp(%s) GROUP BY 1",
            [instant],
        ).fetchall()
    result.outcomes = Counter({str(outcome): int(n) for outcome, n in rows})
    result.outcomes["no row"] = jobs - sum(result.outcomes.values())
    result.errors = errors.seen
    return result


def run(dsn: str, modes: list[str], jobs: int, hold: float) -> list[Result]:
    results = []
    with psycopg.connect(dsn, autocommit=True) as admin:
        settings = {
            name: admin.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("max_connections", "max_locks_per_transaction")
        }
        print(f"server: {settings}", file=sys.stderr, flush=True)
        for mode in modes:
            db = f"pgmany_{uuid.uuid4().hex[:8]}"
            admin.execute(f'CREATE DATABASE "{db}"')
            url = psycopg.conninfo.make_conninfo(dsn, dbname=db)
            try:
                asyncio.run(migrate(url))
                results.append(asyncio.run(measure(url, mode, jobs, hold)))
            finally:
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return results


def render(results: list[Result], jobs: int, hold: float) -> str:
    lines = [f"{jobs:,} jobs due at one instant, each run holding its lock {hold:g} s"]
    lines.append(f"  {'':32}" + "".join(f"{r.mode:>14}" for r in results))

    def row(label: str, values: list[str]) -> None:
        lines.append(f"  {label:<32}" + "".join(f"{v:>14}" for v in values))

    row("runs started", [f"{r.started:,}" for r in results])
    row("most runs going at once", [f"{r.running_peak:,}" for r in results])
    row("last start after the instant, s", [f"{r.last_start_s:.2f}" for r in results])
    row("advisory locks at the peak", [f"{r.locks_peak:,}" for r in results])
    for r in results:
        lines.append(f"  {r.mode}: the tick's rows {dict(r.outcomes)}")
        lines.append(f"  {r.mode}: logged {dict(r.errors.most_common(4))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True, help="a server, with rights to CREATE DATABASE")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--hold", type=float, default=4.0, help="seconds each run lasts")
    parser.add_argument("--modes", nargs="+", default=["advisory", "lease"])
    args = parser.parse_args(argv)
    print(render(run(args.dsn, args.modes, args.jobs, args.hold), args.jobs, args.hold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
