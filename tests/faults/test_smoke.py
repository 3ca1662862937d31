"""The fault-injection machinery itself: replicas and analysis on the suite's cluster with no
fault, and proof that each fault tool does what the scenarios rely on (the partition drops
both directions without a FIN or RST, libfaketime shifts the wall clock only, pgbouncer
proxies)."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from tests.faults.analysis import real_time
from tests.faults.cluster import Database, PgCluster
from tests.faults.faketime import faketime_env
from tests.faults.fleet import Fleet
from tests.faults.netns import NetworkNamespace
from tests.faults.pooler import PgBouncers, PoolMode

# ---- two replicas, no fault ------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_two_replicas_run_every_tick_exactly_once(
    replicas: Fleet, summary: Callable[[str], None]
) -> None:
    for replica_id in ("r1", "r2"):
        replicas.start(replica_id, jobs=4, every_s=1, task_ms=100)
    analysis, codes = replicas.run_without_faults(["r1", "r2"], 6)
    by_replica = Counter(run.replica for run in analysis.runs)
    outcomes = Counter(row.outcome for row in analysis.ledger)
    summary(
        f"[smoke: 2 replicas, 4 jobs every 1 s, 100 ms task, no fault] {analysis} | "
        f"runs by replica={dict(sorted(by_replica.items()))} outcomes={dict(outcomes)} "
        f"exit codes={codes}"
    )
    assert analysis.tick_count >= 4 * 6
    assert codes == {"r1": 0, "r2": 0}
    assert set(outcomes) == {"succeeded"}, outcomes


# ---- the network partition -------------------------------------------------------------------

#: A process inside the namespace holding one connection, running ``select 1`` per input line.
HOLDER = """
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True, application_name="partition probe")
print(conn.info.backend_pid, flush=True)
for _ in sys.stdin:
    print(conn.execute("SELECT 1").fetchone()[0], flush=True)
"""
#: Connect from inside the namespace; print connected, refused or timeout.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timeout")
"""
UNUSED_PORT = 9  # "discard": nothing listens on it in the namespace, so a SYN gets an RST


def connect(host: str, port: int, timeout: float) -> str:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    return "connected"


def connect_from(netns: NetworkNamespace, host: str, port: int, timeout: float) -> str:
    return netns.exec([sys.executable, "-c", CONNECT, host, str(port), str(timeout)]).strip()


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no answer within {timeout} s"
    return proc.stdout.readline().strip()


@pytest.mark.timeout(60)
def test_partition_drops_both_directions_and_heal_restores(
    netns: NetworkNamespace, pg: PgCluster, db: Database
) -> None:
    host, inside = netns.host_address, netns.namespace_address
    assert connect_from(netns, host, pg.port, 2) == "connected"
    assert connect(inside, UNUSED_PORT, 2) == "refused"  # the RST comes back
    holder = subprocess.Popen(
        netns.command([sys.executable, "-c", HOLDER, pg.dsn(db.name, host=host)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with holder:  # closes the pipes; the finally kills it first whatever happens
        try:
            server_pid = int(read_line(holder, 15))
            netns.partition()
            # Outbound SYNs vanish, and so do inbound ones: no RST either way, only silence.
            assert connect_from(netns, host, pg.port, 1.5) == "timeout"
            assert connect(inside, UNUSED_PORT, 1.5) == "timeout"
            # The established connection got no FIN/RST: the server still has the session.
            assert server_pid in [pid for pid, _, _ in db.sessions()]
            netns.heal()
            assert connect_from(netns, host, pg.port, 2) == "connected"
            assert connect(inside, UNUSED_PORT, 2) == "refused"
            # ... and the very same connection carries on.
            assert holder.stdin is not None
            holder.stdin.write("go\n")
            holder.stdin.flush()
            assert read_line(holder, 15) == "1"
        finally:
            holder.kill()
            holder.wait(10)


# ---- libfaketime -----------------------------------------------------------------------------

#: The child's wall and monotonic clocks, and how long (monotonic) a 0.2 s Event wait took.
CLOCKS = """
import json, threading, time
t0 = time.monotonic()
threading.Event().wait(0.2)
waited = time.monotonic() - t0
print(json.dumps({"wall": time.time(), "mono": time.monotonic(), "waited": waited}))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("offset", "shift_s"), [("+30s", 30.0), ("-10s", -10.0)])
def test_faketime_shifts_the_wall_clock_not_the_monotonic_one(offset: str, shift_s: float) -> None:
    wall_before, mono_before = time.time(), time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", CLOCKS],
        env=faketime_env(offset),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    wall_after, mono_after = time.time(), time.monotonic()
    clocks = json.loads(child.stdout)
    assert mono_before <= clocks["mono"] <= mono_after  # one monotonic clock for all
    assert wall_before + shift_s - 0.5 <= clocks["wall"] <= wall_after + shift_s + 0.5
    # Timed waits (what a replica's scheduler and tasks block on) still take real time.
    assert 0.15 <= clocks["waited"] <= 2.0
    assert abs((real_time(clocks["mono"]).timestamp() + shift_s) - clocks["wall"]) < 0.5


# ---- pgbouncer -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_pgbouncer_proxies_in_its_pool_mode(
    pgbouncers: PgBouncers, db: Database, mode: PoolMode
) -> None:
    bouncer = pgbouncers[mode]
    # pgbouncer 1.18 cannot carry prepared statements in transaction mode: never prepare.
    with psycopg.connect(
        bouncer.dsn(db.name), autocommit=True, prepare_threshold=None, connect_timeout=10
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        [(dbname,)] = conn.execute("SELECT current_database()").fetchall()
        assert dbname == db.name
    # Its admin console (simple query protocol only) confirms the pool mode.
    with psycopg.connect(
        bouncer.dsn("pgbouncer"),
        autocommit=True,
        prepare_threshold=None,
        cursor_factory=psycopg.ClientCursor,
        connect_timeout=10,
    ) as admin:
        config = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
    assert config["pool_mode"] == mode


# ---- the cluster's own faults and the ways to start a replica --------------------------------


@pytest.mark.timeout(90)
def test_cluster_terminate_restart_stop_and_start(pg: PgCluster, db: Database) -> None:
    [(own,)] = db.rows("SELECT pg_backend_pid()")
    holder = psycopg.connect(db.dsn, autocommit=True, application_name="victim")
    with holder:
        assert db.terminate_all() == 1  # the holder, not the test's own session
        assert db.own_pid() == own
        with pytest.raises(psycopg.OperationalError):
            holder.execute("SELECT 1")
    pg.restart()
    assert db.rows("SELECT 1") == [(1,)]  # reconnected after the restart
    assert db.own_pid() != own
    pg.stop()
    assert not pg.running()
    with pytest.raises(psycopg.OperationalError):
        db.rows("SELECT 1")
    pg.start()
    assert db.rows("SELECT 1") == [(1,)]


@pytest.mark.timeout(90)
def test_replicas_start_in_the_namespace_under_faketime_and_through_pgbouncer(
    replicas: Fleet, db: Database, netns: NetworkNamespace
) -> None:
    """Each way of starting a replica reaches the cluster the way it should, with the clock it
    should have. (Whether skewed replicas keep the promises is for the scenarios to say.)"""
    ids = ["inside", "ahead", "pooled", "all-three"]
    replicas.start("inside", jobs=2, in_namespace=True)
    replicas.start("ahead", jobs=2, faketime="+30s")
    replicas.start("pooled", jobs=2, via="session")
    replicas.start("all-three", jobs=2, in_namespace=True, faketime="-10s", via="session")
    replicas.wait_ready(ids)
    sessions = {app: addr for _, app, addr in db.sessions()}
    assert sessions["replicron inside"] == netns.namespace_address  # straight from it
    assert sessions["replicron ahead"] == "127.0.0.1"
    assert sessions["replicron pooled"] == "127.0.0.1"  # pgbouncer's own address
    assert sessions["replicron all-three"] == "127.0.0.1"
    skew = {
        e["replica"]: e["wall"] - real_time(e["mono"]).timestamp() for e in replicas.events("ready")
    }
    assert skew["inside"] == pytest.approx(0, abs=0.5)
    assert skew["ahead"] == pytest.approx(30, abs=0.5)
    assert skew["pooled"] == pytest.approx(0, abs=0.5)
    assert skew["all-three"] == pytest.approx(-10, abs=0.5)
    assert replicas.stop() == dict.fromkeys(ids, 0)
    assert replicas.leaked_locks() == []
