"""One clock for the cluster (replicas whose wall clocks are 30 s ahead or 10 s behind, under
libfaketime) and connection poolers in front of PostgreSQL (pgbouncer: transaction mode is
refused every time in advisory mode and works in lease mode, session mode works in both)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from replicron.postgres import PostgresBackend, TransactionPoolerError, migrate
from tests.faults.cluster import Database
from tests.faults.fleet import Fleet, both_modes
from tests.faults.pooler import PgBouncers

Summary = Callable[[str], None]


@both_modes
@pytest.mark.timeout(120)
def test_clocks_30_s_ahead_and_10_s_behind_run_every_tick_once_on_time(
    replicas: Fleet, summary: Summary
) -> None:
    replicas.start("r1", jobs=3, every_s=1, task_ms=50)
    replicas.start("r2", jobs=3, every_s=1, task_ms=50, faketime="+30s")
    replicas.start("r3", jobs=3, every_s=1, task_ms=50, faketime="-10s")
    analysis, codes = replicas.run_without_faults(["r1", "r2", "r3"], 8)
    by_replica = Counter(run.replica for run in analysis.runs)
    missed = [row for row in analysis.ledger if row.outcome == "missed"]
    latest = max(run.lead_ms() for run in analysis.runs)
    summary(
        f"[clocks: r2 +30 s, r3 -10 s (libfaketime), 3 jobs every 1 s] {analysis} | "
        f"latest start={latest:+.0f}ms runs by replica={dict(sorted(by_replica.items()))} "
        f"written off as missed={len(missed)} exit={codes}"
    )
    assert missed == [], "ticks written off as missed by a replica with a wrong clock"
    assert len(by_replica) >= 2 or by_replica.get("r1"), by_replica  # not all on a skewed one
    assert "off the database's" in replicas.logs()  # the skewed replicas warned


@contextmanager
def busy_clients(dsn: str, count: int = 6) -> Iterator[None]:
    """Clients keeping pgbouncer's server connections busy with short transactions."""
    stop = threading.Event()

    def client() -> None:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            while not stop.is_set():
                conn.execute("SELECT pg_sleep(0.002)")

    threads = [threading.Thread(target=client, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


async def try_open(dsn: str, tries: int, *, session_pooler: bool = False) -> Counter[str]:
    found: Counter[str] = Counter()
    for i in range(tries):
        backend = PostgresBackend(dsn, migrate=False, session_pooler=session_pooler)
        try:
            await backend.open(f"pooled-{i}")
        except TransactionPoolerError:
            found["refused"] += 1
        else:
            found["accepted"] += 1
        finally:
            await backend.close()
    return found


@pytest.mark.timeout(120)
def test_a_transaction_pooler_is_refused_every_time(
    db: Database, pgbouncers: PgBouncers, summary: Summary
) -> None:
    pooled = pgbouncers["transaction"].dsn(db.name)
    started = time.monotonic()
    # Migrations take a transaction-scoped lock: through the pooler they finish, never hang.
    applied = asyncio.run(asyncio.wait_for(migrate(pooled), 30))
    migrated = time.monotonic() - started
    alone = asyncio.run(try_open(pooled, 10))
    # Told, wrongly, that it is a session pooler: the probe rounds still find it out, also
    # when the pooler hands out its idle server sessions in turn.
    misdeclared = asyncio.run(try_open(pooled, 10, session_pooler=True))
    round_robin = pgbouncers.transaction_round_robin.dsn(db.name)
    misdeclared_rr = asyncio.run(try_open(round_robin, 10, session_pooler=True))
    with busy_clients(pooled):
        busy = asyncio.run(try_open(pooled, 30))
    leaked = db.advisory_locks()
    summary(
        f"[pgbouncer, transaction mode] migrate through it: {len(applied)} applied in "
        f"{migrated:.2f} s | a replica alone: {alone['refused']}/10 refused | declared a "
        f"session pooler: {misdeclared['refused']}/10 refused, with server_round_robin: "
        f"{misdeclared_rr['refused']}/10 refused | with 6 busy clients: "
        f"{busy['refused']}/30 refused | advisory locks left={len(leaked)}"
    )
    assert alone == Counter(refused=10)
    assert misdeclared == Counter(refused=10)
    assert misdeclared_rr == Counter(refused=10)
    assert busy == Counter(refused=30)
    assert leaked == []


@both_modes
@pytest.mark.timeout(120)
def test_a_session_pooler_works(replicas: Fleet, summary: Summary) -> None:
    for replica_id in ("r1", "r2"):
        replicas.start(replica_id, jobs=3, every_s=1, task_ms=50, via="session")
    analysis, codes = replicas.run_without_faults(["r1", "r2"], 5)
    summary(f"[pgbouncer, session mode, 2 replicas, 3 jobs every 1 s] {analysis} exit={codes}")
    assert codes == {"r1": 0, "r2": 0}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coordination", ["lease"])
def test_lease_mode_works_through_a_transaction_pooler(
    replicas: Fleet, db: Database, pgbouncers: PgBouncers, summary: Summary
) -> None:
    """Three replicas through pgbouncer in transaction mode (one through a pooler that hands
    out its server sessions in turn, one from the network namespace), beside clients keeping
    the pool's server sessions busy: each statement may land on another server session, and
    every tick runs once."""
    round_robin = pgbouncers.transaction_round_robin
    replicas.start("r1", jobs=3, every_s=1, task_ms=50, via="transaction")
    replicas.start("r2", jobs=3, every_s=1, task_ms=50, via="transaction", in_namespace=True)
    replicas.start("r3", jobs=3, every_s=1, task_ms=50, dsn=round_robin.dsn(db.name))
    with busy_clients(pgbouncers["transaction"].dsn(db.name)):
        analysis, codes = replicas.run_without_faults(["r1", "r2", "r3"], 8)
    by_replica = Counter(run.replica for run in analysis.runs)
    summary(
        f"[lease mode through pgbouncer, transaction mode, 3 replicas beside 6 busy clients, "
        f"3 jobs every 1 s] {analysis} | runs by replica={dict(sorted(by_replica.items()))} "
        f"advisory locks={len(db.advisory_locks())} exit={codes}"
    )
    assert codes == {"r1": 0, "r2": 0, "r3": 0}
    assert db.advisory_locks() == []
