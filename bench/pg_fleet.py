"""A fleet in miniature: replica processes sharing jobs that all fall due together, on one
PostgreSQL, measured and set against bench/scale_model.py's figures for the same fleet.

    .venv/bin/python bench/pg_fleet.py  # 12 x 2,000 every 10 s
    .venv/bin/python bench/pg_fleet.py --period 60 --bursts 3
    .venv/bin/python bench/pg_fleet.py --dsn postgresql://postgres@127.0.0.1/test  # a server
    .venv/bin/python bench/pg_fleet.py --coordination lease  # PostgresBackend(coordination=)
    .venv/bin/python bench/pg_fleet.py --coordination lease --pgbouncer 10 --replicas 100 \
        --jobs 600 --bursts 10  # through pgbouncer in transaction mode, 10 server connections

By default it starts a throwaway cluster as bench/pg_scale.py does (bench/_pg_scale_server.py:
fsync on, pg_stat_statements) and removes it at the end. ``--replicas`` processes
(bench/_pg_fleet_replica.py) each register the same ``--jobs`` jobs, ``every(seconds=period)``
with a sync task of ``--task-ms``, on the scheduler's defaults (10 worker threads,
``PostgresBackend(url, coordination=...)``, advisory unless ``--coordination lease``). After
a warm-up, a window of ``--bursts`` whole periods is measured; it opens and closes half a
second before an instant, so it holds whole bursts.

Measured: statements per second by kind and the ticks they carried (``pg_stat_statements``),
ticks claimed, ticks asked for that another replica had (the claims' rows beyond the ticks
won, and the replicas' ``on_taken`` events), conflicting tries (inserts that found the tick's
row there: run ids drawn from the ledger's sequence in the window less the rows that have
them; a statement that drew ids and was then rolled back, past its deadline, counts too: see
the lock errors), round trips per tick won (statements, less lease mode's bounds pipelined
with each), rows written, WAL (``pg_stat_wal``), connections per replica
(``pg_stat_activity``, sampled), advisory locks held at the peak of each burst (``pg_locks``,
sampled every few ms around the instants), start lateness (the task's first ``time.time()``
minus its tick), each replica's share of the runs (the ledger), CPU of the server, the
replicas and everything else. Prints the table, measured next to the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import scale_model
from _pg_scale_server import (
    Conn,
    Server,
    Snapshot,
    connections,
    create_database,
    drop_database,
    prepare_monitoring,
    progress,
    server_spent,
    snapshot,
    start_cluster,
    statement_names,
    tear_down,
    use_server,
)
from _pgbouncer import PgBouncer
from pg_scale import Replica, sleep_until

from replicron.postgres import migrate

ROOT = Path(__file__).resolve().parent.parent
REPLICA = ROOT / "bench" / "_pg_fleet_replica.py"
READY_TIMEOUT = 300.0
STOP_TIMEOUT = 90.0
#: At least this long from ready to the window: PostgreSQL 15 hands an idle session's
#: counters to pg_stat_database up to 10 s late, and every replica must have seen the others
#: (heartbeats every 5 s) before a burst is measured.
MIN_WARMUP = 16.0


@dataclass
class Measured:
    window: float = 0.0
    ticks: int = 0
    #: By kind: statements/s, their rows (ticks)/s, mean ms.
    statements: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    rows_per_s: dict[str, float] = field(default_factory=dict)
    wal_bytes_per_s: float = 0.0
    fpi_per_s: float = 0.0
    connections: dict[str, int] = field(default_factory=dict)
    peak_locks: list[int] = field(default_factory=list)
    lateness_ms: list[float] = field(default_factory=list)
    ledger_lateness_ms: list[float] = field(default_factory=list)
    runs: int = 0
    ledger_rows: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    share: dict[str, float] = field(default_factory=dict)
    taken: int = 0  # on_taken events of measured ticks, all replicas
    missed: int = 0
    lock_errors: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # cores
    session_pids: list[int] = field(default_factory=list)  # the replicas' server processes
    #: The ledger's run id sequence as the window opened and closed: every insert tried,
    #: won or not, draws one.
    run_ids: tuple[int, int] = (0, 0)
    conflicting_tries: int = 0  # run ids drawn in the window that no row has
    server_connections: int = 0  # to the fleet's database, the most at once


def quantile(ordered: list[float], q: float) -> float:
    return ordered[max(1, math.ceil(q * len(ordered))) - 1] if ordered else math.nan


def wal(conn: Conn) -> tuple[int, int, float]:
    """WAL bytes and full-page images so far, and the CPU seconds of this monitoring
    connection's server process (its sampling of pg_locks is not the fleet's work)."""
    row = conn.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal").fetchone()
    assert row is not None
    stat = Path(f"/proc/{conn.info.backend_pid}/schedstat")
    monitor = int(stat.read_text().split()[0]) / 1e9 if stat.exists() else 0.0
    return int(row[0]), int(row[1]), monitor


def run_ids_drawn(url: str) -> int:
    """The last run id drawn from the ledger's sequence (0 before the first)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM replicron_runs_run_id_seq"
        ).fetchone()
    return int(row[0]) if row else 0


def advisory_locks(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    return int(row[0]) if row else 0


def watch(conn: Conn, db: str, first: int, end: int, period: int, m: Measured) -> None:
    """Until half a second before ``end``: connections every half second, and the advisory
    locks held every few milliseconds from 0.3 s before each instant to 0.7 s after it."""
    seen: Counter[str] = Counter()
    instant, peak = first, 0
    m.session_pids = [
        int(pid)
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s"
            " AND application_name LIKE 'replicron %%'",
            [db],
        )
    ]
    while time.time() < end - 0.5:
        now = time.time()
        if instant - 0.3 <= now < instant + 0.7:
            peak = max(peak, advisory_locks(conn))
            time.sleep(0.003)
            continue
        if now >= instant + 0.7:
            m.peak_locks.append(peak)
            instant, peak = instant + period, 0
            continue
        now_seen = connections(conn, db)
        seen |= now_seen
        m.server_connections = max(m.server_connections, sum(now_seen.values()))
        sleep_until(min(end - 0.5, instant - 0.3, time.time() + 0.5))
    m.connections = dict(seen)


def account(
    m: Measured,
    server: Server,
    before: Snapshot,
    after: Snapshot,
    wal0: tuple[int, int, float],
    wal1: tuple[int, int, float],
) -> None:
    window = m.window = after.at - before.at
    names = statement_names()
    for queryid, (calls, rows, ms, text) in after.statements.items():
        calls0, rows0, ms0, _ = before.statements.get(queryid, (0, 0, 0.0, ""))
        if calls == calls0:
            continue
        first_line = text.strip().splitlines()[0] if text.strip() else ""
        name = names.get(first_line, " ".join(text.split())[:30])
        n, r, t = m.statements.get(name, (0.0, 0.0, 0.0))
        m.statements[name] = (n + calls - calls0, r + rows - rows0, t + ms - ms0)
    m.statements = {
        k: (n / window, r / window, t / n if n else 0.0) for k, (n, r, t) in m.statements.items()
    }
    for k in ("tup_inserted", "tup_updated", "tup_deleted", "xact_commit", "deadlocks"):
        m.rows_per_s[k] = (after.db[k] - before.db[k]) / window
    m.wal_bytes_per_s = (wal1[0] - wal0[0]) / window
    m.fpi_per_s = (wal1[1] - wal0[1]) / window
    replicas = sum(cpu - before.replica_cpu[pid] for pid, cpu in after.replica_cpu.items())
    spent = server_spent(server, before, after)
    monitor = wal1[2] - wal0[2]
    own = after.own_cpu - before.own_cpu
    sessions = sum(
        after.server_cpu.get(pid, 0.0) - before.server_cpu.get(pid, 0.0) for pid in m.session_pids
    )
    m.cpu = {
        "server": (spent - monitor) / window,
        "sessions": sessions / window,
        "monitor": monitor / window,
        "replicas": replicas / window,
        "other": max(0.0, (after.busy - before.busy - replicas - spent - own) / window),
    }


def analyse(m: Measured, outputs: list[dict[str, Any]], url: str, first: int, end: int) -> None:
    by_replica: Counter[str] = Counter()
    for output in outputs:
        for _, tick, started in output["samples"]:
            if first <= tick < end:
                by_replica[output["replica_id"]] += 1
                m.lateness_ms.append((started - tick) * 1000.0)
        m.taken += sum(n for tick, n in output["taken"] if first <= tick < end)
        m.missed += sum(n for tick, n in output["missed"] if first <= tick < end)
        m.lock_errors += int(output["lock_errors"])
    m.lateness_ms.sort()
    m.runs = sum(by_replica.values())
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT replica_id, outcome, extract(epoch FROM started_at - scheduled_at) * 1000"
            " FROM replicron_runs WHERE NOT manual"
            " AND scheduled_at >= to_timestamp(%s) AND scheduled_at < to_timestamp(%s)",
            [first, end],
        ).fetchall()
        first_id, last_id = m.run_ids
        row = conn.execute(
            "SELECT count(*) FROM replicron_runs WHERE run_id > %s AND run_id <= %s",
            [first_id, last_id],
        ).fetchone()
        m.conflicting_tries = last_id - first_id - (int(row[0]) if row else 0)
    m.ledger_rows = len(rows)
    m.outcomes = Counter(str(outcome) for _, outcome, _ in rows)
    ran = Counter(str(replica) for replica, outcome, _ in rows if outcome == "succeeded")
    m.share = {r: ran[r] / max(1, sum(ran.values())) for r in sorted(ran)}
    m.ledger_lateness_ms = sorted(float(late) for _, o, late in rows if o == "succeeded" and late)


def run(server: Server, args: argparse.Namespace, rundir: Path) -> Measured:
    db = f"pgfleet_{uuid.uuid4().hex[:8]}"
    create_database(server, db)
    url = server.url(db)
    bouncer = None
    try:
        if args.pgbouncer:
            params = server.params
            bouncer = PgBouncer(
                str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)), args.pgbouncer
            )
            bouncer.start()
            progress(f"pgbouncer (transaction mode, {args.pgbouncer} server connections) started")
        replica_url = url if bouncer is None else bouncer.url(db)
        asyncio.run(migrate(url))
        replicas = []
        for i in range(args.replicas):
            rid = f"r{i + 1:02d}"
            command = [
                sys.executable,
                str(REPLICA),
                "--dsn",
                replica_url,
                "--replica-id",
                rid,
                "--jobs",
                str(args.jobs),
                "--period",
                str(args.period),
                "--task-ms",
                str(args.task_ms),
                "--out",
                str(rundir / f"{rid}.json"),
                "--coordination",
                args.coordination,
            ]
            replicas.append(Replica(command, rid, rundir / f"{rid}.json"))
        deadline = time.monotonic() + READY_TIMEOUT
        for replica in replicas:
            replica.expect("ready", deadline)
        progress(f"{args.replicas} replicas ready")
        period = args.period
        first = math.ceil((time.time() + max(MIN_WARMUP, period + 6)) / period) * period
        end = first + args.bursts * period
        m = Measured(ticks=args.jobs * args.bursts)
        with server.connect(server.monitor_db) as conn:
            sleep_until(first - 0.5)
            pids = [replica.proc.pid for replica in replicas]
            drawn = run_ids_drawn(url)
            before, wal0 = snapshot(server, conn, db, pids), wal(conn)
            watch(conn, db, first, end, period, m)
            after, wal1 = snapshot(server, conn, db, pids), wal(conn)
            m.run_ids = (drawn, run_ids_drawn(url))
        account(m, server, before, after, wal0, wal1)
        sleep_until(end + 2.0)  # late runs of the measured ticks
        for replica in replicas:
            replica.ask_to_stop()
        outputs = []
        deadline = time.monotonic() + STOP_TIMEOUT
        for replica in replicas:
            try:
                replica.expect("stopped", deadline)
                replica.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            finally:
                replica.kill()
            outputs.append(json.loads(replica.out.read_text()))
        analyse(m, outputs, url, first, end)
        return m
    finally:
        Replica.kill_all()
        if bouncer is not None:
            bouncer.stop()
        drop_database(server, db)


def render(m: Measured, args: argparse.Namespace) -> str:
    # The server shares this machine's cores; the ledger is new: nothing is past retention.
    fleet = scale_model.Fleet(
        replicas=args.replicas,
        jobs=args.jobs,
        period=args.period,
        task_s=args.task_ms / 1000,
        server_cores=os.cpu_count() or 1,
        pruning=False,
    )
    model = scale_model.model(fleet, scale_model.costs(args.inputs))
    s = m.statements
    prefix = "lease_" if args.coordination == "lease" else ""  # lease mode's statements

    def named(name: str) -> tuple[float, float, float]:
        return s.get(prefix + name, s.get(name, (0.0, 0.0, 0.0)))

    per_s = sum(n for n, _, _ in s.values())
    claims = named("claim")
    won = m.ticks / m.window
    lines = [
        f"{args.replicas} replicas x {args.jobs:,} jobs every {args.period} s, "
        f"{args.task_ms:g} ms tasks, {args.coordination} coordination; "
        f"{args.bursts} bursts in {m.window:.0f} s",
        f"{'':44}{'measured':>12}{'model':>12}",
    ]

    def row(label: str, measured: float, key: str | None, digits: int = 1) -> None:
        modelled = model[key].value if key else math.nan
        lines.append(f"  {label:<42}{measured:>12,.{digits}f}{modelled:>12,.{digits}f}")

    row("statements/s", per_s, "statements_per_s")
    row("claim statements/s", claims[0], "claim_statements_per_s")
    row("release statements/s", named("release")[0], "release_statements_per_s")
    row("heartbeats/s", named("heartbeat")[0], "heartbeats_per_s", 2)
    row("ticks claimed/s (runs)", won, "claims_per_s")
    row("ticks asked/s (claim rows)", claims[1], "tries_per_s")
    row("taken ticks asked per tick (claim rows)", claims[1] / won - 1, "conflicts_per_tick", 2)
    row("  ticks answered taken per tick (on_taken)", m.taken / m.ticks, "conflicts_per_tick", 2)
    # An insert tried and refused by the unique key (or rolled back with its statement: lock
    # errors). In lease mode a claim passes over a tick whose row is there already: asked
    # and answered taken, never tried.
    row("conflicting tries per tick (run ids drawn)", m.conflicting_tries / m.ticks, None, 2)
    # Lease mode's bounds (set_config) go pipelined with each statement: no round trip; and
    # pgbouncer's own SET application_name, as it hands a client a server connection, is none
    # of the replica's.
    own = ("SELECT set_config", "SET application_name")
    trips = sum(n for name, (n, _, _) in s.items() if not name.startswith(own))
    row("round trips per tick won", trips / won, None, 3)
    row("  of which claims", claims[0] / won, None, 3)
    row("ledger rows inserted/s", m.rows_per_s["tup_inserted"], "claims_per_s")
    row("rows updated/s", m.rows_per_s["tup_updated"], None)
    row("commits/s", m.rows_per_s["xact_commit"], None)
    row("WAL kB/s", m.wal_bytes_per_s / 1000, "wal_kb_per_s")
    row("  without full-page images (model)", math.nan, "wal_rows_kb_per_s")
    row("full-page images/s", m.fpi_per_s, None)
    row("server CPU, cores", m.cpu["server"], "server_cores", 3)
    row("  of which the replicas' sessions", m.cpu["sessions"], "server_cores", 3)
    row(
        "replica CPU per instant, ms",
        m.cpu["replicas"] * args.period / args.replicas * 1e3,
        "replica_cpu_ms",
    )
    sessions = sum(n for name, n in m.connections.items() if name in m.share)
    row("lock sessions, all replicas (most seen)", sessions, "connections", 0)
    if args.pgbouncer:  # the pooler's server connections, whatever their application name
        row("server connections at once (most seen)", m.server_connections, None, 0)
    row(
        "advisory locks at a burst's peak (median)",
        statistics.median(m.peak_locks or [0]),
        "peak_locks",
        0,
    )
    row("start lateness p50, ms", quantile(m.lateness_ms, 0.5), "lateness_p50_ms")
    row("start lateness p99, ms", quantile(m.lateness_ms, 0.99), "lateness_p99_ms")
    row("largest share of the runs", max(m.share.values(), default=math.nan), "share_max", 3)
    row("smallest share of the runs", min(m.share.values(), default=math.nan), "share_min", 3)
    lines.append(
        f"  runs {m.runs:,} of {m.ticks:,} ticks; ledger rows {m.ledger_rows:,}, outcomes "
        f"{dict(m.outcomes)}; on_missed {m.missed}, lock errors {m.lock_errors}"
    )
    lines.append(
        f"  ledger lateness (started_at) p50 {quantile(m.ledger_lateness_ms, 0.5):.1f} ms, "
        f"p99 {quantile(m.ledger_lateness_ms, 0.99):.1f} ms; max task lateness "
        f"{quantile(m.lateness_ms, 1.0):.1f} ms"
    )
    lines.append(
        f"  CPU cores: replicas {m.cpu['replicas']:.2f}, other processes {m.cpu['other']:.2f},"
        f" the bench's sampling on the server {m.cpu['monitor']:.3f} (left out above)"
    )
    lines.append("  statements by kind: calls/s, rows/s (a claim's: its ticks), mean ms")
    for name, (n, r, ms) in sorted(s.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"    {name:<26}{n:>10.2f}{r:>12.1f}{ms:>9.2f}")
    lines.append(f"  connections by application: {dict(sorted(m.connections.items()))}")
    lines.append(f"  advisory locks at each burst's peak: {m.peak_locks}")
    lines.append(f"  runs by replica: { {k: round(v, 3) for k, v in m.share.items()} }")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", help="use this server, not a throwaway cluster")
    parser.add_argument("--replicas", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--period", type=int, default=10, help="seconds between bursts")
    parser.add_argument("--bursts", type=int, default=12, help="bursts measured")
    parser.add_argument("--task-ms", type=float, default=5.0)
    parser.add_argument("--inputs", type=Path, help="the model's costs (pg_ledger.py --out)")
    parser.add_argument("--out", type=Path, help="write the measured figures here (JSON)")
    parser.add_argument("--coordination", choices=("advisory", "lease"), default="advisory")
    parser.add_argument(
        "--pgbouncer",
        type=int,
        metavar="SERVER_CONNECTIONS",
        help="replicas connect through pgbouncer in transaction mode (lease mode only)",
    )
    args = parser.parse_args(argv)
    if args.pgbouncer and args.coordination != "lease":
        parser.error("--pgbouncer: advisory mode refuses a transaction pooler")
    server: Server | None = None
    rundir = Path(tempfile.mkdtemp(prefix="replicron-pg-fleet."))
    began = time.monotonic()
    try:
        server = use_server(args.dsn) if args.dsn else start_cluster()
        prepare_monitoring(server)
        measured = run(server, args, rundir)
    except KeyboardInterrupt:
        return 130
    finally:
        Replica.kill_all()
        tear_down(server, None)
        shutil.rmtree(rundir, ignore_errors=True)
    progress(f"took {time.monotonic() - began:.0f} s")
    print(render(measured, args))
    if args.out:
        data = {k: v for k, v in measured.__dict__.items() if k != "lateness_ms"}
        args.out.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
