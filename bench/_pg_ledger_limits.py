"""bench/pg_ledger.py's janitor and lock-table measurements: a prune's cost over a ledger
written by SQL, and how many advisory locks the server's lock table holds."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from _pg_scale_server import Conn, Server, create_database, drop_database, progress

from replicron.postgres import PostgresBackend, migrate

REPLICA = "pod-5d8f7c9b6-x2x7k:1"


def one(conn: Conn, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def lsn(conn: Conn) -> int:
    """The WAL's insert position, in bytes."""
    high, low = str(one(conn, "SELECT pg_current_wal_insert_lsn()::text")).split("/")
    return (int(high, 16) << 32) + int(low, 16)


# ---- retention ------------------------------------------------------------------------------


PLAN_WORDS = ("Join", "Loop", "Scan", "SubPlan", "Rows Removed", "Execution")
FILL = """
INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id, claimed_at, started_at,
                            finished_at, outcome, claim_token, lock_key, backend_pid)
SELECT '', 'job-' || lpad(j::text, 5, '0'), at, %(replica)s, at - interval '50 ms',
       at + interval '1 ms', at + interval '6 ms', 'succeeded', gen_random_uuid(),
       hashtextextended('job-' || lpad(j::text, 5, '0'), 0), 4242
FROM generate_series(0, %(instants)s - 1) AS i,
     LATERAL (SELECT %(first)s::timestamptz + i * interval '1 minute' AS at) AS tick,
     generate_series(0, %(jobs)s - 1) AS j
ORDER BY i, j
"""


async def prune_cost(server: Server, jobs: int, instants: int, passes: int) -> dict[str, Any]:
    """Passes of the janitor's prune over ``jobs`` x ``instants`` finished rows, the older
    half past retention (as after two weeks at retention=timedelta(days=14))."""
    db = f"prune_{jobs}_{int(time.time())}"
    create_database(server, db)
    url = server.url(db)
    try:
        await migrate(url)
        first = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=30)
        retention = datetime.now(UTC) - (first + timedelta(minutes=instants // 2))
        with server.connect(db) as conn:
            t0 = time.perf_counter()
            conn.execute(
                FILL, {"replica": REPLICA, "instants": instants, "first": first, "jobs": jobs}
            )
            conn.execute("VACUUM ANALYZE replicron_runs")
            progress(f"  {jobs * instants:,} rows written in {time.perf_counter() - t0:.0f} s")
            backend = PostgresBackend(url, heartbeat_interval=200.0, migrate=False)
            await backend.open("pruner")
            try:
                from replicron.postgres._sql import queries

                params = {"namespace": "", "retention": retention, "batch": 1000}
                with conn.transaction(force_rollback=True):
                    plan = [
                        str(row[0])
                        for row in conn.execute(
                            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + queries()["prune"], params
                        )
                    ]
                seconds, deleted, wal = [], [], 0
                for _ in range(passes):
                    t0, wal0 = time.perf_counter(), lsn(conn)
                    [(count,)] = await backend._fetch("prune", retention=retention, batch=1000)
                    seconds.append(time.perf_counter() - t0)
                    wal += lsn(conn) - wal0
                    deleted.append(int(count))
            finally:
                await backend.close()
        return {
            "jobs": jobs,
            "instants": instants,
            "rows": jobs * instants,
            "seconds": seconds,
            "deleted": deleted,
            "wal_per_row": wal / max(1, sum(deleted)),
            "plan": [line for line in plan if any(word in line for word in PLAN_WORDS)],
        }
    finally:
        drop_database(server, db)


# ---- the lock table -------------------------------------------------------------------------


def lock_slots(server: Server) -> dict[str, dict[str, int]]:
    """Advisory locks one session takes before the lock table is full, at the cluster's
    max_connections and again at PostgreSQL's default of 100 (the cluster restarted)."""
    out = {}
    for connections in (None, 100):
        if connections is not None:
            restart(server, {"max_connections": str(connections)})
        with server.connect(server.monitor_db) as conn:
            names = (
                "max_locks_per_transaction",
                "max_connections",
                "autovacuum_max_workers",
                "max_worker_processes",
                "max_wal_senders",
                "max_prepared_transactions",
            )
            s = {n: int(one(conn, f"SELECT current_setting('{n}')")) for n in names}
            backends = sum(s[n] for n in names[1:]) + 1  # + the autovacuum launcher
            found = {**s, "predicted": s["max_locks_per_transaction"] * backends}
            held = 0
            try:
                while held < 4 * found["predicted"]:
                    conn.execute(LOCK_MORE, [held + 1, held + 250])
                    held += 250
            except psycopg.Error as exc:
                progress(f"  after {held:,} advisory locks: {str(exc).splitlines()[0]}")
            finally:
                conn.execute("SELECT pg_advisory_unlock_all()")
            found["held_before_error"] = held
            out[str(s["max_connections"])] = found
    return out


LOCK_MORE = "SELECT count(pg_advisory_lock(k)) FROM generate_series(%s::int, %s::int) k"


def restart(server: Server, settings: dict[str, str]) -> None:
    """Restart our throwaway cluster with these settings."""
    import temp_postgres  # tools/: on the path once _pg_scale_server is imported

    assert server.own_cluster is not None
    with server.connect(server.admin_db) as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    workdir = server.own_cluster
    bindir = Path((workdir / "bindir").read_text().strip())
    data = workdir / "data"
    temp_postgres.run(
        temp_postgres.server_user(),
        workdir,
        bindir / "pg_ctl",
        "-D",
        data,
        "-l",
        workdir / "postgres.log",
        "-m",
        "fast",
        "-w",
        "-t",
        "60",
        "restart",
    )
    server.postmaster_pid = int((data / "postmaster.pid").read_text().split()[0])
