"""bench/pg_scale.py's server and machine: a throwaway cluster or a given server, the
scenarios' databases, and what the server and the machine did over a window (pg_stat_*, CPU)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import temp_postgres  # tools/ is no package: found on the path above

CLUSTER_PREFIX = "replicron-pg-scale."
CLUSTER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "top",
    "track_io_timing": "on",
    "max_connections": "300",
    "log_lock_waits": "on",
    "log_min_duration_statement": "1000",
}
Conn = psycopg.Connection[tuple[Any, ...]]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the server -----------------------------------------------------------------------------


@dataclass
class Server:
    """Where the scenarios' databases are made, and how the server is watched."""

    params: dict[str, Any]  # libpq keywords, without dbname
    admin_db: str  # CREATE and DROP DATABASE go here
    monitor_db: str  # pg_stat_* are read from here: none of its statements are counted
    own_cluster: Path | None  # the throwaway cluster's directory, if it is ours
    pgss: bool = False  # pg_stat_statements readable
    version: str = ""
    postmaster_pid: int | None = None
    made_dbs: list[str] = field(default_factory=list)

    def url(self, dbname: str) -> str:
        p = self.params
        user = quote(str(p.get("user", "postgres")), safe="")
        password = f":{quote(str(p['password']), safe='')}" if p.get("password") else ""
        port = f":{p['port']}" if p.get("port") else ""
        return f"postgresql://{user}{password}@{p.get('host', '127.0.0.1')}{port}/{dbname}"

    def connect(self, dbname: str) -> Conn:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=10)


def start_cluster() -> Server:
    """A throwaway cluster with pg_stat_statements preloaded (see tools/temp_postgres.py)."""
    for stale in Path(tempfile.gettempdir()).glob(f"{CLUSTER_PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            if not Path(f"/proc/{int((stale / 'owner').read_text())}").exists():
                progress(f"removing the cluster of an earlier run that was killed: {stale}")
                temp_postgres.stop(stale)
    bindir = temp_postgres.server_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, pg_ctl) were found: use --dsn")
    user = temp_postgres.server_user()
    workdir = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX))
    (workdir / "owner").write_text(f"{os.getpid()}\n")
    (workdir / "bindir").write_text(f"{bindir}\n")
    if user is not None:
        os.chown(workdir, user.pw_uid, user.pw_gid)
    server = Server({}, "postgres", "postgres", workdir)
    data = workdir / "data"
    temp_postgres.run(
        user,
        workdir,
        bindir / "initdb",
        "-D",
        data,
        "-U",
        "postgres",
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    )
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\n# bench/pg_scale.py\n")
        conf.writelines(f"{key} = {value}\n" for key, value in CLUSTER_SETTINGS.items())
    for attempt in range(3):
        port = temp_postgres.free_port()
        try:
            temp_postgres.run(
                user,
                workdir,
                bindir / "pg_ctl",
                "-D",
                data,
                "-l",
                workdir / "postgres.log",
                "-o",
                f"-p {port} -h 127.0.0.1 -k '{workdir}'",
                "-w",
                "-t",
                "60",
                "start",
            )
            break
        except subprocess.CalledProcessError:
            if attempt == 2:
                raise
    server.params = {"host": "127.0.0.1", "port": port, "user": "postgres"}
    server.postmaster_pid = int((data / "postmaster.pid").read_text().split()[0])
    progress(f"started a throwaway PostgreSQL cluster at 127.0.0.1:{port} in {workdir}")
    return server


def use_server(dsn: str) -> Server:
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if v is not None}
    admin_db = str(params.pop("dbname", "postgres"))
    server = Server(params, admin_db, f"pgscale_monitor_{uuid.uuid4().hex[:8]}", None)
    create_database(server, server.monitor_db)
    return server


def prepare_monitoring(server: Server) -> None:
    with server.connect(server.monitor_db) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
        server.version = str(row[0]).split(" ")[0] if row else "?"
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT count(*) FROM pg_stat_statements")
            server.pgss = True
        except psycopg.Error as exc:
            progress(f"pg_stat_statements cannot be read, its figures are left out: {exc}")


def create_database(server: Server, name: str) -> None:
    with server.connect(server.admin_db) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    server.made_dbs.append(name)


def drop_database(server: Server, name: str) -> None:
    with server.connect(server.admin_db) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if name in server.made_dbs:
        server.made_dbs.remove(name)


def tear_down(server: Server | None, keep_log: Path | None) -> None:
    """Leave no cluster running and no database behind (on every exit)."""
    if server is None:
        return
    if server.own_cluster is not None:
        if keep_log is not None:
            with contextlib.suppress(OSError):
                shutil.copy(server.own_cluster / "postgres.log", keep_log)
        temp_postgres.stop(server.own_cluster)
        progress("stopped and removed the throwaway cluster")
        return
    for name in list(server.made_dbs):
        with contextlib.suppress(psycopg.Error):
            drop_database(server, name)


def statement_names() -> dict[str, str]:
    """replicron's named queries by their first line (pg_stat_statements keeps comments)."""
    from replicron.postgres._sql import queries

    return {text.strip().splitlines()[0]: name for name, text in queries().items()}


# ---- what the server and the machine did ----------------------------------------------------


def cpu_of(pid: int, reaped: bool = False) -> float:
    """CPU seconds (user and system, all threads) of a live process, with ``reaped`` also
    of its children that exited and it waited for; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def busy_seconds() -> float:
    """CPU seconds all processes of the machine have used, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


DB_COUNTERS = (
    "xact_commit",
    "xact_rollback",
    "tup_returned",
    "tup_fetched",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "deadlocks",
)


@dataclass
class Snapshot:
    at: float
    busy: float
    replica_cpu: dict[int, float]
    #: Our cluster: the postmaster with the backends it reaped, and its live children; the
    #: CPU of backends that came and went in the window is in the difference of the sums.
    #: Another server: its backends of the scenario's database (those that went are lost).
    server_cpu: dict[int, float]
    own_cpu: float
    db: dict[str, int]
    statements: dict[int, tuple[int, int, float, str]]  # queryid: calls, rows, ms, text


def server_cpu(server: Server, conn: Conn, db: str) -> dict[int, float]:
    """CPU of the server processes whose work is the scenario's: the whole cluster if it is
    ours, else the backends of the scenario's database (if the server runs on this machine)."""
    if (postmaster := server.postmaster_pid) is not None:
        children = {pid: cpu_of(pid) for pid in children_of(postmaster)}
        return {postmaster: cpu_of(postmaster, reaped=True), **children}
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [db]).fetchall()
    return {row[0]: cpu_of(row[0]) for row in rows}


def server_spent(server: Server, before: Snapshot, after: Snapshot) -> float:
    """The server's CPU seconds between two snapshots."""
    if server.postmaster_pid is not None:
        return sum(after.server_cpu.values()) - sum(before.server_cpu.values())
    return sum(cpu - before.server_cpu.get(pid, 0.0) for pid, cpu in after.server_cpu.items())


def snapshot(server: Server, conn: Conn, db: str, replica_pids: list[int]) -> Snapshot:
    columns = ", ".join(DB_COUNTERS)
    row = conn.execute(f"SELECT {columns} FROM pg_stat_database WHERE datname = %s", [db])
    counters = row.fetchone() or (0,) * len(DB_COUNTERS)
    statements = {}
    if server.pgss:
        for queryid, calls, rows, ms, text in conn.execute(
            "SELECT queryid, calls, rows, total_exec_time, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
            [db],
        ):
            statements[queryid] = (calls, rows, ms, text)
    times = os.times()
    return Snapshot(
        at=time.time(),
        busy=busy_seconds(),
        replica_cpu={pid: cpu_of(pid) for pid in replica_pids},
        server_cpu=server_cpu(server, conn, db),
        own_cpu=times.user + times.system,
        db=dict(zip(DB_COUNTERS, counters, strict=True)),
        statements=statements,
    )


def connections(conn: Conn, db: str) -> Counter[str]:
    """Connections to ``db`` by replica (the last word of their application_name)."""
    rows = conn.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
        [db],
    ).fetchall()
    return Counter({(str(name).split(" ")[-1] or "unnamed"): n for name, n in rows})
