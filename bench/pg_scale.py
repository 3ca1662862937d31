"""PostgreSQL at scale: bursts of per-second jobs over three replica processes, the idle cost,
and APScheduler 4 side by side.

    .venv/bin/python bench/pg_scale.py             # full run, about 10 minutes
    .venv/bin/python bench/pg_scale.py --quick     # smoke test, under 2 minutes, no APScheduler
    .venv/bin/python bench/pg_scale.py --no-check  # exit 0 even if a target fails
    .venv/bin/python bench/pg_scale.py --dsn postgresql://postgres@127.0.0.1/test  # a server

By default it starts a throwaway PostgreSQL cluster of its own, as tools/temp_postgres.py
does (initdb and pg_ctl, as the OS user postgres when root, a free port on 127.0.0.1), with
``pg_stat_statements`` preloaded and PostgreSQL's default durability (fsync on), and removes
it at the end, also on Ctrl-C or SIGTERM. With ``--dsn`` it uses that server instead, and
shows the ``pg_stat_statements`` figures only if the extension can be loaded there. Each
scenario gets a database of its own, dropped after it.

Each scenario runs three replica processes (bench/_pg_scale_replica.py) with the same jobs,
for a warm-up and then a measured window of whole-second ticks:

* replicron: ``Scheduler(backend=PostgresBackend(url))`` with its defaults; N jobs
  ``every(seconds=1)`` whose sync task sleeps 5 ms, N = 1, 100, 600 and 2,000; and 1,000
  hourly jobs, none due, for the idle cost.
* APScheduler 4.0.0a6 for N = 1 and 600 and the idle case, right before or after replicron's
  run of the same scenario: its AsyncScheduler with an SQLAlchemy data store and an asyncpg
  event broker on the same server, in a virtualenv of its own that this script makes
  (bench/.venv-apscheduler4, git-ignored, reused when present) from the package index.

What is measured (docs/benchmarks.md says more):

* start lateness in the task, the same way for both libraries: its first ``time.time()``
  minus its tick; each replica keeps them in memory and writes them out at the end;
* runs per tick from the same records (duplicates, ticks nobody ran), each replica's share;
* replicron's ledger, ``replicron_runs``: a row and an outcome per tick, and ``started_at``,
  the run's real start (a cross-check of the lateness), and its ``on_taken`` events (another
  replica inserted the tick's row first) per tick;
* the server: deltas of ``pg_stat_statements`` (statements, their rows, the busiest ones) and
  ``pg_stat_database`` (commits, rows, deadlocks) for the scenario's database over the window,
  connections per replica from ``pg_stat_activity`` (by application_name);
* CPU of the replicas and of the server, and of every other process (the machine is shared,
  so figures are noisy: above 0.25 cores of other load a warning is printed).

Targets: 600 jobs on 3 replicas run every tick exactly once, none skipped_overlap, p99 start
lateness at most 150 ms, no replica with over half of the runs; 1 job: replicron's p99 at
most a third of APScheduler 4's; idle: at most 1 statement/s per replica.

Needs matplotlib in the project's .venv for the plot, docs/img/pg_scale_lateness.png
(``.venv/bin/python -m pip install -e '.[bench]'``; without it the plot is skipped with a note).
Prints the table on stdout, progress on stderr, and exits 1 when a target fails (unless
``--no-check``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import psycopg
from _pg_scale_report import REPLICAS, TASK_MS, Key, Plan, Result, log_kinds, plot, render
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import temp_postgres  # noqa: E402  (tools/ is no package)

REPLICA = ROOT / "bench" / "_pg_scale_replica.py"
APS_VENV = ROOT / "bench" / ".venv-apscheduler4"
APS_VERSION = "4.0.0a6"
APS_REQUIREMENTS = [
    f"apscheduler=={APS_VERSION}",
    "anyio<4.14",
    "sniffio",
    "psycopg[binary]",
    "sqlalchemy[asyncio]",
    "asyncpg",
]
CLUSTER_PREFIX = "replicron-pg-scale."
CLUSTER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "top",
    "track_io_timing": "on",
    "max_connections": "300",
    "log_lock_waits": "on",
    "log_min_duration_statement": "1000",
}
#: The default warm-up, from the replicas being ready to the window. PostgreSQL 15 hands an
#: idle session's counters to pg_stat_database up to 10 s late: a shorter warm-up counts
#: the transactions the replicas started and registered jobs with as the window's.
WARMUP = 11.0
READY_TIMEOUT = 600.0
STOP_TIMEOUT = 90.0
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
    temp_postgres.run(user, workdir, bindir / "initdb", "-D", data, "-U", "postgres",
                      "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")  # fmt: skip
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\n# bench/pg_scale.py\n")
        conf.writelines(f"{key} = {value}\n" for key, value in CLUSTER_SETTINGS.items())
    for attempt in range(3):
        port = temp_postgres.free_port()
        try:
            temp_postgres.run(user, workdir, bindir / "pg_ctl", "-D", data,
                              "-l", workdir / "postgres.log",
                              "-o", f"-p {port} -h 127.0.0.1 -k '{workdir}'",
                              "-w", "-t", "60", "start")  # fmt: skip
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


# ---- APScheduler 4's virtualenv -------------------------------------------------------------


def aps_python() -> Path:
    """bench/.venv-apscheduler4/bin/python, with APScheduler 4.0.0a6; made if need be."""
    python = APS_VENV / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m; print(m.version('apscheduler'))"]
    if python.exists():
        found = subprocess.run(check, capture_output=True, text=True, timeout=60, check=False)
        if found.stdout.strip() == APS_VERSION:
            return python
    progress(f"making {APS_VENV.relative_to(ROOT)}: {' '.join(APS_REQUIREMENTS)} ...")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(APS_VENV)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *APS_REQUIREMENTS],
                   check=True, timeout=900)  # fmt: skip
    subprocess.run(check, check=True, timeout=60)
    return python


# ---- replica processes ----------------------------------------------------------------------


class Replica:
    """One replica process; its stdout lines arrive on a queue (a reader thread)."""

    live: ClassVar[list[Replica]] = []  # killed on every exit

    def __init__(self, command: list[str], replica_id: str, out: Path) -> None:
        self.replica_id, self.out, self.log = replica_id, out, out.with_suffix(".log")
        with self.log.open("w") as stderr:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True, start_new_session=True,  # Ctrl-C reaches this process only
            )  # fmt: skip
        Replica.live.append(self)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # the end

    def expect(self, word: str, deadline: float) -> None:
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise self.failed(f"did not say {word!r} in time") from None
            if line == word:
                return
            if line == "":
                raise self.failed(f"exited (status {self.proc.wait()}) before saying {word!r}")

    def failed(self, why: str) -> RuntimeError:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return RuntimeError(f"replica {self.replica_id} {why}; its stderr ends:\n{tail}")

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self in Replica.live:
            Replica.live.remove(self)

    @classmethod
    def kill_all(cls) -> None:
        for replica in list(cls.live):
            replica.kill()


def start_replicas(plan: Plan, url: str, rundir: Path, python: Path) -> list[Replica]:
    anchor = math.floor(time.time())  # APScheduler's interval: whole seconds
    minute = (time.gmtime().tm_min + 30) % 60  # the hourly jobs: half an hour away
    replicas: list[Replica] = []
    for replica_id in REPLICAS:
        out = rundir / f"{plan.library}-{plan.jobs}-{plan.schedule}-{replica_id}.json"
        command = [
            str(python), str(REPLICA), "--library", plan.library, "--dsn", url,
            "--replica-id", replica_id, "--jobs", str(plan.jobs), "--schedule", plan.schedule,
            "--minute", str(minute), "--anchor", str(anchor), "--task-ms", str(TASK_MS),
            "--out", str(out),
        ]  # fmt: skip
        replicas.append(Replica(command, replica_id, out))
        if plan.library == "apscheduler4" and len(replicas) == 1:
            # Its data store creates its tables as it starts: one replica first, no race.
            replicas[0].expect("ready", time.monotonic() + READY_TIMEOUT)
    deadline = time.monotonic() + READY_TIMEOUT
    for replica in replicas[1 if plan.library == "apscheduler4" else 0 :]:
        replica.expect("ready", deadline)
    return replicas


def stop_replicas(replicas: list[Replica]) -> list[dict[str, Any]]:
    """Stop them all at once, cleanly; what each measured, with its stderr's records."""
    for replica in replicas:
        replica.ask_to_stop()
    deadline = time.monotonic() + STOP_TIMEOUT
    outputs = []
    for replica in replicas:
        try:
            replica.expect("stopped", deadline)
            replica.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            replica.kill()
        output: dict[str, Any] = json.loads(replica.out.read_text())
        output["log_kinds"] = log_kinds(replica.log.read_text(errors="replace"))
        outputs.append(output)
    return outputs


# ---- what the server and the machine did ----------------------------------------------------


def cpu_of(pid: int) -> float:
    """CPU seconds (user and system, all threads) of a live process; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


DB_COUNTERS = ("xact_commit", "xact_rollback", "tup_returned", "tup_fetched", "tup_inserted",
               "tup_updated", "tup_deleted", "deadlocks")  # fmt: skip


@dataclass
class Snapshot:
    at: float
    busy: float
    replica_cpu: dict[int, float]
    server_cpu: dict[int, float]
    own_cpu: float
    db: dict[str, int]
    statements: dict[int, tuple[int, int, float, str]]  # queryid: calls, rows, ms, text


def server_pids(server: Server, conn: Conn, db: str) -> list[int]:
    """The server processes whose CPU is the scenario's: the whole cluster if it is ours,
    else the backends of the scenario's database (if the server runs on this machine)."""
    if server.postmaster_pid is not None:
        return [server.postmaster_pid, *children_of(server.postmaster_pid)]
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [db]).fetchall()
    return [row[0] for row in rows]


def snapshot(server: Server, conn: Conn, db: str, replicas: list[Replica]) -> Snapshot:
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
        replica_cpu={r.proc.pid: cpu_of(r.proc.pid) for r in replicas},
        server_cpu={pid: cpu_of(pid) for pid in server_pids(server, conn, db)},
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


def sleep_until(instant: float) -> None:
    while (remaining := instant - time.time()) > 0:
        time.sleep(min(remaining, 1.0))


# ---- one scenario ---------------------------------------------------------------------------


def run_plan(server: Server, plan: Plan, rundir: Path, python: Path) -> Result:
    db = f"pgscale_{plan.library}_{plan.jobs}_{uuid.uuid4().hex[:6]}"
    create_database(server, db)
    url = server.url(db)
    try:
        if plan.library == "replicron":
            from replicron.postgres import migrate  # as `replicron migrate` does

            asyncio.run(migrate(url))
        return measure(server, plan, db, url, rundir, python)
    finally:
        Replica.kill_all()
        drop_database(server, db)


def measure(server: Server, plan: Plan, db: str, url: str, rundir: Path, python: Path) -> Result:
    began = time.monotonic()
    replicas = start_replicas(plan, url, rundir, python)
    first = math.ceil(time.time() + plan.warmup)  # the first measured tick
    end = first + int(plan.seconds)  # the first tick after the window
    seen: Counter[str] = Counter()
    with server.connect(server.monitor_db) as conn:
        # The window opens and closes half a second before a tick: it holds the work of the
        # measured ticks (claimed a little ahead of them) and of no others.
        sleep_until(first - 0.5)
        before = snapshot(server, conn, db, replicas)
        while time.time() < end - 0.5:
            seen |= connections(conn, db)  # the most seen of each
            sleep_until(min(end - 0.5, time.time() + 2.0))
        after = snapshot(server, conn, db, replicas)
    sleep_until(end + plan.drain)  # late runs of the measured ticks
    outputs = stop_replicas(replicas)
    result = Result(plan)
    account(result, before, after, seen)
    analyse_samples(result, outputs, first, end)
    if plan.library == "replicron":
        analyse_ledger(result, url, first, end)
    progress(
        f"  {plan.library:<12} {plan.jobs:>5,} {plan.schedule:<12} "
        f"{time.monotonic() - began:5.1f} s, other load {result.other_load:.2f} cores"
    )
    return result


def account(result: Result, before: Snapshot, after: Snapshot, seen: Counter[str]) -> None:
    window = after.at - before.at
    result.rates = {k: (after.db[k] - before.db[k]) / window for k in DB_COUNTERS}
    if after.statements:
        names = statement_names()
        deltas = []
        for queryid, (calls, rows, ms, text) in after.statements.items():
            calls0, rows0, ms0, _ = before.statements.get(queryid, (0, 0, 0.0, ""))
            first_line = text.strip().splitlines()[0] if text.strip() else ""
            name = names.get(first_line, " ".join(text.split())[:40])
            deltas.append((calls - calls0, rows - rows0, ms - ms0, name))
        result.rates["statements"] = sum(d[0] for d in deltas) / window
        result.rates["statement_rows"] = sum(d[1] for d in deltas) / window
        busiest = sorted((d for d in deltas if d[0] > 0), reverse=True)[:3]
        result.top_statements = [(n / window, ms / n, name) for n, _, ms, name in busiest]

    def spent(a: dict[int, float], b: dict[int, float]) -> float:
        return sum(cpu - a.get(pid, 0.0) for pid, cpu in b.items())

    replica_cpu = spent(before.replica_cpu, after.replica_cpu)
    server_cpu = spent(before.server_cpu, after.server_cpu)
    ours = replica_cpu + server_cpu + (after.own_cpu - before.own_cpu)
    result.replica_cpu = replica_cpu / window
    result.server_cpu = server_cpu / window
    result.other_load = max(0.0, (after.busy - before.busy - ours) / window)
    result.connections = {name: seen[name] for name in REPLICAS if name in seen}
    if others := {k: v for k, v in seen.items() if k not in REPLICAS}:
        result.extra["other_connections"] = others


def analyse_samples(result: Result, outputs: list[dict[str, Any]], first: int, end: int) -> None:
    """What the tasks recorded: runs of the measured ticks, per tick and per replica."""
    result.version = str(outputs[0]["version"])
    result.workers = int(outputs[0]["workers"])
    result.start_s = max(float(o["start_s"]) for o in outputs)
    result.shutdown_s = max(float(o["shutdown_s"]) for o in outputs)
    for output in outputs:
        result.log_kinds.update(output["log_kinds"])
    if "max_concurrent_jobs" in outputs[0]:
        result.extra["max_concurrent_jobs"] = outputs[0]["max_concurrent_jobs"]
    per_tick: Counter[tuple[int, float]] = Counter()
    by_replica: Counter[str] = Counter()
    lateness = []
    for output in outputs:
        for index, tick, started in output["samples"]:
            if first <= tick < end:
                per_tick[(index, tick)] += 1
                by_replica[output["replica_id"]] += 1
                lateness.append((started - tick) * 1000.0)
    if result.plan.schedule == "every-second":
        result.expected = result.plan.jobs * (end - first)
    result.runs = sum(per_tick.values())
    result.duplicates = result.runs - len(per_tick)
    result.without_run = result.expected - len(per_tick)
    result.lateness_ms = sorted(lateness)
    if result.runs:
        result.share = {r: by_replica[r] / result.runs for r in REPLICAS}
    if "taken" in outputs[0] and result.expected:
        taken = sum(n for o in outputs for tick, n in o["taken"] if first <= tick < end)
        result.taken_per_tick = taken / result.expected


def analyse_ledger(result: Result, url: str, first: int, end: int) -> None:
    """replicron's ledger for the measured ticks: a row and an outcome each."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT job, scheduled_at, outcome,"
            " extract(epoch FROM started_at - scheduled_at)::float8 * 1000"
            " FROM replicron_runs WHERE NOT manual"
            " AND scheduled_at >= to_timestamp(%s) AND scheduled_at < to_timestamp(%s)",
            [first, end],
        ).fetchall()
    result.outcomes = Counter(str(outcome) for _, _, outcome, _ in rows)
    if result.expected:
        result.ledger_without_row = result.expected - len({(job, at) for job, at, _, _ in rows})
    result.ledger_lateness_ms = sorted(
        late for _, _, outcome, late in rows if outcome == "succeeded" and late is not None
    )


# ---- main -----------------------------------------------------------------------------------


def plans(args: argparse.Namespace) -> list[Plan]:
    """The scenarios in the order they run: each APScheduler run next to replicron's."""
    if args.quick:
        return [
            Plan("replicron", 100, "every-second", 8, WARMUP, 2),
            Plan("replicron", 600, "every-second", 8, WARMUP, 2),
            Plan("replicron", 1000, "hourly", 10, WARMUP, 0),
        ]
    warmup, seconds, drain = args.warmup, args.seconds, 3.0
    one = args.one_seconds or (300.0 if args.long else 60.0)
    chosen = [
        Plan("replicron", 1, "every-second", one, warmup, drain),
        Plan("apscheduler4", 1, "every-second", one, warmup, drain),
        Plan("apscheduler4", 600, "every-second", seconds, warmup, drain),
        Plan("replicron", 600, "every-second", seconds, warmup, drain),
        Plan("replicron", 100, "every-second", seconds, warmup, drain),
        Plan("replicron", 2000, "every-second", seconds, warmup, drain),
        Plan("replicron", 1000, "hourly", args.idle_seconds, warmup, 0.0),
        Plan("apscheduler4", 1000, "hourly", args.idle_seconds, warmup, 0.0),
    ]
    return [p for p in chosen if p.library == "replicron" or not args.no_apscheduler]


def header(results: dict[Key, Result], server: Server, quick: bool) -> list[str]:
    ours = next(r for r in results.values() if r.plan.library == "replicron")
    theirs = next((r for r in results.values() if r.plan.library == "apscheduler4"), None)
    where = "a throwaway cluster, fsync on" if server.own_cluster else "the --dsn server"
    title = f"replicron {ours.version}"
    threads = f"worker threads per replica: replicron {ours.workers}"
    if theirs is not None:
        title += f" vs APScheduler {theirs.version}"
        threads += (
            f", APScheduler {theirs.workers} (at most "
            f"{theirs.extra.get('max_concurrent_jobs')} jobs at once)"
        )
    return [
        f"{title}, on PostgreSQL {server.version} ({where})",
        f"{len(REPLICAS)} replica processes, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, {'quick' if quick else 'full'} run",
        threads,
    ]


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", help="use this server, not a throwaway cluster")
    parser.add_argument("--quick", action="store_true", help="smoke test: short, no APScheduler")
    parser.add_argument("--seconds", type=float, default=20.0, help="window of the bursts (s)")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=WARMUP, help="s before each window")
    parser.add_argument("--long", action="store_true", help="1 job: 300 s measured, not 60")
    parser.add_argument("--one-seconds", type=float, help="1 job: this window (s)")
    parser.add_argument("--no-apscheduler", action="store_true")
    parser.add_argument("--plot", type=Path, help="default: docs/img/pg_scale_lateness.png")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if a target fails")
    parser.add_argument("--keep-logs", action="store_true", help="keep the replicas' stderr")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    chosen = plans(args)
    began = time.monotonic()
    server: Server | None = None
    rundir = Path(tempfile.mkdtemp(prefix="replicron-pg-scale-runs."))
    results: dict[Key, Result] = {}
    try:
        aps = aps_python() if any(p.library == "apscheduler4" for p in chosen) else None
        server = use_server(args.dsn) if args.dsn else start_cluster()
        prepare_monitoring(server)
        for plan in chosen:
            python = aps if plan.library == "apscheduler4" else Path(sys.executable)
            assert python is not None
            results[plan.key] = run_plan(server, plan, rundir, python)
    except KeyboardInterrupt:
        progress("interrupted: the replicas and the server are stopped")
        return 130
    finally:
        Replica.kill_all()
        tear_down(server, rundir / "postgres.log" if args.keep_logs else None)
        if args.keep_logs:
            progress(f"the replicas' outputs and logs are in {rundir}")
        else:
            shutil.rmtree(rundir, ignore_errors=True)
    assert server is not None
    text, checks = render(results, header(results, server, args.quick))
    print(text)
    progress(f"took {time.monotonic() - began:.0f} s")
    plot_path = args.plot or (None if args.quick else ROOT / "docs/img/pg_scale_lateness.png")
    if plot_path is not None:
        progress(plot(results, plot_path))
    failed = any(check.passed is False for check in checks)
    return 1 if failed and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
