"""The ledger's real costs, measured on a throwaway PostgreSQL cluster: the inputs of
bench/scale_model.py.

    .venv/bin/python bench/pg_ledger.py --out ledger.json
    .venv/bin/python bench/pg_ledger.py --dsn postgresql://postgres@127.0.0.1/test  # a server

It starts a cluster as bench/pg_scale.py does (bench/_pg_scale_server.py: fsync on,
pg_stat_statements), or uses ``--dsn``'s server, and measures, each in a database of its own:

1. **Claims and outcomes**, through the real backend (``PostgresBackend``): replica A claims
   ``--jobs`` per-minute jobs at ``--instants`` past minutes and records each run succeeded,
   then replica B claims the same ticks and finds them taken. Each statement's server CPU
   (``/proc/PID/schedstat`` of its backend process, so only with the server on this machine)
   and WAL (``pg_current_wal_insert_lsn``) are summed by kind, at two batch sizes, and fitted
   as ``per statement + per tick * ticks``. Autovacuum is off for the table, so that its WAL
   is not counted as the statements' (``ANALYZE`` every ten minutes instead: without fresh
   statistics the claim's plans go bad as the table grows).
2. **Full-page images**: after a ``CHECKPOINT``, one more minute of claims and outcomes writes
   each touched index page whole once; the WAL beyond a minute without a checkpoint, per job.
3. **Sizes**: bytes per row of the table and per entry of each index, as written (each row
   inserted, then updated with its outcome) and after ``VACUUM``; ``pgstattuple`` if present.
4. **The janitor**: ``abandon_stale`` on that table; ``prune`` (batches of 1,000, as the
   backend sends it) on a table of ``--prune-jobs`` x ``--prune-instants`` finished rows
   written by SQL, half of them past retention: seconds per pass, rows deleted, its plan.
5. **The lock table**: advisory locks one session can hold before "out of shared memory",
   against ``max_locks_per_transaction x (max_connections + other processes)``.

Prints a summary; ``--out`` writes the figures as JSON for ``scale_model.py --inputs``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from _pg_ledger_limits import REPLICA, lock_slots, lsn, one, prune_cost
from _pg_scale_server import (
    Conn,
    Server,
    create_database,
    drop_database,
    prepare_monitoring,
    progress,
    start_cluster,
    tear_down,
    use_server,
)

from replicron.backends import ClaimRequest, Release, RunRecord
from replicron.events import Outcome
from replicron.postgres import PostgresBackend, migrate

T = TypeVar("T")
#: Names as long as real ones: a pod's hostname and a pid, a job with a five-digit suffix.
REPLICA_A, REPLICA_B = REPLICA, "pod-5d8f7c9b6-q8m4p:1"
#: Batch sizes (ticks per statement): small, as in a fleet (a replica's share of a burst
#: claimed ahead, outcomes of runs ending together, a chunk of others' ticks), and large.
SMALL = {"claim_won": 100, "release": 10, "claim_taken": 200}
LARGE = {"claim_won": 1000, "release": 100, "claim_taken": 1000}
PAGE = 8192


def job(index: int) -> str:
    return f"job-{index:05d}"


def cpu_ns(pid: int) -> int:
    """Nanoseconds a process has run on a CPU (the scheduler's own account)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


@dataclass
class Tally:
    """What one kind of statement cost, summed, at one batch size."""

    statements: int = 0
    ticks: int = 0
    cpu_ns: int = 0  # the server process's
    client_ns: int = 0  # this process's (the backend's Python side)
    wal: int = 0
    wall_s: float = 0.0


@dataclass
class Fit:
    """cost(statement of n ticks) = per_statement + per_tick * n."""

    cpu_us_per_statement: float
    cpu_us_per_tick: float
    wal_per_statement: float
    wal_per_tick: float
    client_us_per_statement: float
    client_us_per_tick: float
    round_trip_ms_small: float
    round_trip_ms_large: float


def fit(small: Tally, large: Tally) -> Fit:
    def line(a: float, b: float) -> tuple[float, float]:
        n1, n2 = small.ticks / small.statements, large.ticks / large.statements
        c1, c2 = a / small.statements, b / large.statements
        if n1 == n2:  # one batch size: all of it per tick
            return 0.0, (c1 + c2) / (n1 + n2)
        slope = (c2 - c1) / (n2 - n1)
        return max(0.0, c1 - slope * n1), slope

    cpu = line(small.cpu_ns / 1000, large.cpu_ns / 1000)
    wal = line(small.wal, large.wal)
    client = line(small.client_ns / 1000, large.client_ns / 1000)
    rtt = (small.wall_s * 1000 / small.statements, large.wall_s * 1000 / large.statements)
    return Fit(*cpu, *wal, *client, *rtt)


@dataclass
class Results:
    server: str = ""
    jobs: int = 0
    instants: int = 0
    fits: dict[str, Fit] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)
    hot_updates: float = math.nan  # share of the outcome updates that were HOT
    fpi_bytes_per_job: float = math.nan
    fpi_pages_per_job: float = math.nan
    sizes: dict[str, dict[str, float]] = field(default_factory=dict)  # when -> what -> B/row
    tuples: dict[str, dict[str, float]] = field(default_factory=dict)  # pgstattuple
    abandon_stale_ms: list[float] = field(default_factory=list)
    prune: dict[str, Any] = field(default_factory=dict)  # by jobs
    lock_slots: dict[str, dict[str, int]] = field(default_factory=dict)  # by max_connections


# ---- 1-3: claims, outcomes, sizes ----------------------------------------------------------


class Meter:
    """Times one backend's statements: its server process's CPU, the WAL, the wall clock."""

    def __init__(self, mon: Conn, pid: int) -> None:
        self.mon, self.pid = mon, pid

    async def __call__(self, tally: Tally, ticks: int, step: Awaitable[T]) -> T:
        wal0, cpu0 = lsn(self.mon), cpu_ns(self.pid)
        t0, client0 = time.perf_counter(), time.process_time_ns()
        result = await step
        t1, client1 = time.perf_counter(), time.process_time_ns()
        tally.wal += lsn(self.mon) - wal0
        tally.cpu_ns += cpu_ns(self.pid) - cpu0
        tally.client_ns += client1 - client0
        tally.wall_s += t1 - t0
        tally.statements += 1
        tally.ticks += ticks
        return result


def pid_of(backend: PostgresBackend) -> int:
    """The server process of a backend's lock session."""
    session = backend._session
    assert session is not None
    assert session.backend_pid is not None
    return session.backend_pid


def chunks(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


async def one_minute(
    a: PostgresBackend,
    b: PostgresBackend,
    meter_a: Meter,
    meter_b: Meter,
    tick: datetime,
    jobs: int,
    sizes: dict[str, int],
    tallies: dict[str, Tally],
) -> None:
    """A claims every job's tick, records each run succeeded; then B finds them taken."""
    requests = [ClaimRequest(job(i), tick, True) for i in range(jobs)]
    claims = []
    for batch in chunks(requests, sizes["claim_won"]):
        claims += await meter_a(tallies["claim_won"], len(batch), a.claim(batch))
    assert all(c.run_id is not None and c.locked for c in claims), "A should win every tick"
    started, finished = tick + timedelta(milliseconds=1), tick + timedelta(milliseconds=6)
    releases = [
        Release(
            RunRecord(
                c.job,
                c.scheduled_at,
                Outcome.SUCCEEDED,
                REPLICA_A,
                c.run_id,
                started,
                finished,
                None,
            ),
            True,
        )
        for c in claims
    ]
    for done in chunks(releases, sizes["release"]):
        await meter_a(tallies["release"], len(done), a.release(done))
    for batch in chunks(requests, sizes["claim_taken"]):
        taken = await meter_b(tallies["claim_taken"], len(batch), b.claim(batch))
        assert all(c.run_id is None for c in taken), "B should find every tick taken"


def tuple_stats(conn: Conn) -> dict[str, float]:
    """pgstattuple of the table: live and dead rows, their bytes, free space."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        cursor = conn.execute(
            "SELECT tuple_count, tuple_len, dead_tuple_count, dead_tuple_len, free_space,"
            " table_len FROM pgstattuple('replicron_runs')"
        )
    except psycopg.Error as exc:
        progress(f"pgstattuple is not available: {exc}")
        return {}
    row = cursor.fetchone()
    assert row is not None
    names = ("live", "live_bytes", "dead", "dead_bytes", "free_bytes", "table_bytes")
    return dict(zip(names, (float(v) for v in row), strict=True))


def relation_sizes(conn: Conn, rows: int) -> dict[str, float]:
    """Bytes per ledger row: the table (heap), each index, and all of it."""
    sizes: dict[str, float] = {"table": one(conn, "SELECT pg_relation_size('replicron_runs')")}
    for name, size in conn.execute(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index"
        " WHERE indrelid = 'replicron_runs'::regclass ORDER BY 1"
    ):
        sizes[str(name)] = size
    sizes["total"] = one(conn, "SELECT pg_total_relation_size('replicron_runs')")
    return {k: v / rows for k, v in sizes.items()}


async def full_page_images(
    a: PostgresBackend,
    b: PostgresBackend,
    meters: tuple[Meter, Meter],
    mon: Conn,
    minute: datetime,
    jobs: int,
    res: Results,
) -> None:
    """The WAL of a minute right after a checkpoint, beyond that of a minute without one."""
    wal, fpi = [0, 0], [0, 0]
    for checkpoint in (0, 1):
        if checkpoint:
            mon.execute("CHECKPOINT")
        time.sleep(1.2)  # the backends' WAL counters reach pg_stat_wal
        fpi0 = one(mon, "SELECT wal_fpi FROM pg_stat_wal")
        tallies = {k: Tally() for k in SMALL}
        tick = minute + timedelta(minutes=checkpoint)
        await one_minute(a, b, *meters, tick, jobs, LARGE, tallies)
        time.sleep(1.2)
        fpi[checkpoint] = one(mon, "SELECT wal_fpi FROM pg_stat_wal") - fpi0
        wal[checkpoint] = sum(t.wal for t in tallies.values())
    res.fpi_bytes_per_job = (wal[1] - wal[0]) / jobs
    res.fpi_pages_per_job = (fpi[1] - fpi[0]) / jobs


async def claims_and_outcomes(
    server: Server, res: Results, jobs: int, instants: int, analyze: bool = True
) -> None:
    db = f"ledger_{int(time.time())}"
    create_database(server, db)
    url = server.url(db)
    try:
        await migrate(url)
        with server.connect(db) as conn, server.connect(server.monitor_db) as mon:
            conn.execute("ALTER TABLE replicron_runs SET (autovacuum_enabled = off)")
            a = PostgresBackend(url, heartbeat_interval=60.0)
            b = PostgresBackend(url, heartbeat_interval=60.0)
            for backend in (a, b):
                for i in range(jobs):
                    backend.register_job(job(i))
            await a.open(REPLICA_A)
            await b.open(REPLICA_B)
            try:
                meter_a, meter_b = Meter(mon, pid_of(a)), Meter(mon, pid_of(b))
                now = datetime.now(UTC).replace(second=0, microsecond=0)
                first = now - timedelta(minutes=instants + 10)
                for n in range(instants):
                    size = "small" if n % 2 == 0 else "large"
                    tallies = {k: res.tallies.setdefault(f"{k}/{size}", Tally()) for k in SMALL}
                    sizes = SMALL if size == "small" else LARGE
                    await one_minute(
                        a, b, meter_a, meter_b, first + timedelta(minutes=n), jobs, sizes, tallies
                    )
                    if analyze and n % 10 == 9:  # as autovacuum's analyze would
                        conn.execute("ANALYZE replicron_runs")
                    if n % 20 == 19:
                        progress(f"  {n + 1} minutes of {jobs:,} jobs claimed and recorded")
                for kind in SMALL:
                    small, large = res.tallies[f"{kind}/small"], res.tallies[f"{kind}/large"]
                    res.fits[kind] = fit(small, large)
                minute = first + timedelta(minutes=instants)
                await full_page_images(a, b, (meter_a, meter_b), mon, minute, jobs, res)
                rows = (instants + 2) * jobs
                res.sizes["as written"] = relation_sizes(conn, rows)
                res.tuples["as written"] = tuple_stats(conn)
                # The janitor over a partial index full of finished rows, then vacuumed.
                for vacuum in (False, False, False, True):
                    if vacuum:
                        conn.execute("VACUUM replicron_runs")
                    t0 = time.perf_counter()
                    await a._fetch("abandon_stale", stale_after=timedelta(seconds=180))
                    res.abandon_stale_ms.append((time.perf_counter() - t0) * 1000)
            finally:
                await a.close()
                await b.close()
            res.sizes["after VACUUM"] = relation_sizes(conn, rows)
            res.tuples["after VACUUM"] = tuple_stats(conn)
            time.sleep(1.5)  # the backends' table counters reach the statistics
            upd, hot = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE relname = 'replicron_runs'"
            ).fetchone() or (0, 0)
            res.hot_updates = hot / upd if upd else math.nan
    finally:
        drop_database(server, db)


# ---- main ----------------------------------------------------------------------------------


def summary(res: Results) -> str:
    out = [f"PostgreSQL {res.server}; {res.jobs:,} jobs x {res.instants} minutes"]
    out.append(
        "statement     server us/stmt us/tick  WAL B/stmt B/tick  client us/stmt us/tick"
        "  round trip ms (n)"
    )
    for kind, f in res.fits.items():
        n1, n2 = SMALL[kind], LARGE[kind]
        out.append(
            f"{kind:<13} {f.cpu_us_per_statement:14.0f} {f.cpu_us_per_tick:7.1f} "
            f"{f.wal_per_statement:11.0f} {f.wal_per_tick:6.0f} "
            f"{f.client_us_per_statement:14.0f} {f.client_us_per_tick:7.1f}  "
            f"{f.round_trip_ms_small:.1f} ({n1}), {f.round_trip_ms_large:.1f} ({n2})"
        )
    out.append(f"outcome updates that were HOT: {res.hot_updates:.0%}")
    out.append(
        f"after a checkpoint, per job touched: {res.fpi_bytes_per_job:,.0f} WAL bytes, "
        f"{res.fpi_pages_per_job:.2f} full-page images"
    )
    for when, sizes in res.sizes.items():
        cells = ", ".join(f"{k} {v:.1f}" for k, v in sizes.items())
        out.append(f"bytes per row, {when}: {cells}")
    for when, t in res.tuples.items():
        if t:
            out.append(
                f"pgstattuple, {when}: {t['live']:,.0f} live rows of "
                f"{t['live_bytes'] / t['live']:.1f} B, {t['dead']:,.0f} dead, "
                f"{t['free_bytes'] / t['table_bytes']:.0%} free"
            )
    out.append("abandon_stale ms: " + ", ".join(f"{ms:.1f}" for ms in res.abandon_stale_ms))
    for jobs, p in res.prune.items():
        mean = sum(p["seconds"]) / len(p["seconds"])
        out.append(
            f"prune, {int(jobs):,} jobs, {p['rows']:,} rows: {mean:.2f} s a pass "
            f"(min {min(p['seconds']):.2f}, max {max(p['seconds']):.2f}), "
            f"deleting {p['deleted']}, {p['wal_per_row']:.0f} WAL B/row"
        )
        out.extend(f"    {line}" for line in p["plan"])
    for connections, slots in res.lock_slots.items():
        out.append(
            f"lock table at max_connections {connections}: {slots['predicted']:,} slots by the"
            f" formula, {slots['held_before_error']:,} advisory locks held before the error"
        )
    return "\n".join(out)


async def measure(server: Server, args: argparse.Namespace) -> Results:
    res = Results(server=server.version, jobs=args.jobs, instants=args.instants)
    progress("claims and outcomes through the backend ...")
    await claims_and_outcomes(server, res, args.jobs, args.instants, not args.no_analyze)
    for jobs in args.prune_jobs:
        progress(f"prune over {jobs:,} jobs ...")
        res.prune[str(jobs)] = await prune_cost(
            server, jobs, args.prune_instants, args.prune_passes
        )
    if server.own_cluster is not None:  # never fill a shared server's lock table
        progress("the lock table ...")
        try:
            res.lock_slots = lock_slots(server)
        except Exception as exc:  # the figures so far are still worth printing
            progress(f"  the lock table could not be probed: {exc!r}")
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", help="use this server, not a throwaway cluster")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--instants", type=int, default=100, help="minutes claimed (even)")
    parser.add_argument("--prune-jobs", type=int, nargs="*", default=[2000, 10000])
    parser.add_argument("--prune-instants", type=int, default=100)
    parser.add_argument("--prune-passes", type=int, default=8)
    parser.add_argument("--no-analyze", action="store_true", help="see the claims go slow")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = parser.parse_args(argv)
    server: Server | None = None
    try:
        server = use_server(args.dsn) if args.dsn else start_cluster()
        prepare_monitoring(server)
        began = time.monotonic()
        res = asyncio.run(measure(server, args))
        progress(f"took {time.monotonic() - began:.0f} s")
    finally:
        tear_down(server, None)
    print(summary(res))
    if args.out:
        args.out.write_text(json.dumps(asdict(res), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
