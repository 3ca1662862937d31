"""PostgreSQL at scale: bursts of per-second jobs over three replica processes, the idle cost,
and APScheduler 4 side by side.

    .venv/bin/python bench/pg_scale.py             # full run, about 10 minutes
    .venv/bin/python bench/pg_scale.py --quick     # smoke test, under 2 minutes, no APScheduler
    .venv/bin/python bench/pg_scale.py --no-check  # exit 0 even if a target fails
    .venv/bin/python bench/pg_scale.py --only rolling  # one kind of scenario
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
* a rolling restart: 600 jobs of 30 ms tasks (the threads 60 % busy; 90 % on the two
  replicas left while one restarts). Each replica in turn is stopped cleanly 0.1 s into a
  burst and replaced by a new process with its replica id once it has stopped (as a
  StatefulSet rolls out), the next once that one is ready. Every tick of the window must
  run once and none be recorded missed.

What is measured (docs/benchmarks.md says more):

* start lateness in the task, the same way for both libraries: its first ``time.time()``
  minus its tick; each replica keeps them in memory and writes them out at the end;
* runs per tick from the same records (duplicates, ticks nobody ran), each replica's share;
* replicron's ledger, ``replicron_runs``: a row and an outcome per tick, and ``started_at``,
  the run's real start (a cross-check of the lateness), and its ``on_taken`` events (another
  replica inserted the tick's row first) per tick;
* the server: deltas of ``pg_stat_statements`` (statements, their rows, the busiest ones) and
  ``pg_stat_database`` (commits, rows, deadlocks) for the scenario's database over the window,
  connections per replica from ``pg_stat_activity`` (by application_name, the most seen in
  samples every half second);
* CPU of the replicas and of the server (of our cluster: with the backends that exited in
  the window), and of every other process (the machine is shared, so figures are noisy:
  above 0.25 cores of other load a warning is printed).

Targets: 600 jobs on 3 replicas run every tick exactly once, none skipped_overlap, p99 start
lateness at most 150 ms, no replica with over half of the runs; 1 job: replicron's p99 at
most a third of APScheduler 4's; idle: at most 1 statement/s per replica.

Needs matplotlib in the project's .venv for the plot, docs/img/pg_scale_lateness.png
(``.venv/bin/python -m pip install -e '.[bench]'``; without it the plot is skipped with a note):
a CDF of the start lateness per scenario over the measured ticks, so a curve that ends below
1 had ticks with no run.

bench/_pg_scale_server.py has the cluster and what the server and the machine did,
bench/_pg_scale_report.py the table, the targets and the plot.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from _pg_scale_report import REPLICAS, Key, Plan, Result, log_kinds, plot, render
from _pg_scale_server import (
    DB_COUNTERS,
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

ROOT = Path(__file__).resolve().parent.parent
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
#: The default warm-up, from the replicas being ready to the window. PostgreSQL 15 hands an
#: idle session's counters to pg_stat_database up to 10 s late: a shorter warm-up counts
#: the transactions the replicas started and registered jobs with as the window's.
WARMUP = 11.0
READY_TIMEOUT = 600.0
STOP_TIMEOUT = 90.0
#: The rolling restart's tasks: 600 a second of 30 ms on 3 x 10 threads keep them 60 % busy
#: (90 % on two), so that every burst is spread over the replicas and part of it waits for a
#: free thread; at 40 ms two replicas could not keep up while the third restarts.
ROLLING_TASK_MS = 30.0
#: When after a burst's instant a replica is stopped in the rolling restart (seconds): it
#: holds ticks it left for others, and runs not started yet.
BURST_STOP = 0.1


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
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *APS_REQUIREMENTS], check=True, timeout=900
    )
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
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # Ctrl-C reaches this process only
            )
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


def start_replica(
    plan: Plan, url: str, rundir: Path, python: Path, replica_id: str, generation: int = 1
) -> Replica:
    anchor = math.floor(time.time())  # APScheduler's interval: whole seconds
    minute = (time.gmtime().tm_min + 30) % 60  # the hourly jobs: half an hour away
    schedule = "hourly" if plan.schedule == "hourly" else "every-second"
    name = f"{plan.library}-{plan.jobs}-{plan.schedule}-{replica_id}-{generation}"
    out = rundir / f"{name}.json"
    command = [
        str(python),
        str(REPLICA),
        "--library",
        plan.library,
        "--dsn",
        url,
        "--replica-id",
        replica_id,
        "--jobs",
        str(plan.jobs),
        "--schedule",
        schedule,
        "--minute",
        str(minute),
        "--anchor",
        str(anchor),
        "--task-ms",
        str(plan.task_ms),
        "--out",
        str(out),
    ]
    return Replica(command, replica_id, out)


def start_replicas(plan: Plan, url: str, rundir: Path, python: Path) -> list[Replica]:
    replicas: list[Replica] = []
    for replica_id in REPLICAS:
        replicas.append(start_replica(plan, url, rundir, python, replica_id))
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
    return [stopped(replica, deadline) for replica in replicas]


def stopped(replica: Replica, deadline: float) -> dict[str, Any]:
    """Once ``replica`` (asked to stop) has: what it measured, with its stderr's records."""
    try:
        replica.expect("stopped", deadline)
        replica.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        replica.kill()
    output: dict[str, Any] = json.loads(replica.out.read_text())
    output["log_kinds"] = log_kinds(replica.log.read_text(errors="replace"))
    return output


def restart_in_turn(
    replicas: list[Replica], first: int, end: int, start_again: Callable[[str, int], Replica]
) -> list[dict[str, Any]]:
    """A rolling restart within the window, as a StatefulSet rolls out (one pod fewer for a
    moment, the harder case): each replica in turn is stopped cleanly mid-burst (a
    SIGTERM's shutdown), and once it has stopped a new process with the same replica id
    takes its place; the next waits for that one to be ready. Returns what the stopped ones
    measured."""
    outputs = []
    for k, old in enumerate(list(replicas)):
        sleep_until(first + (k + 1) * (end - first) / (len(replicas) + 1) + BURST_STOP)
        progress(f"  restarting {old.replica_id} at {time.time() - first:.1f} s")
        old.ask_to_stop()
        outputs.append(stopped(old, time.monotonic() + STOP_TIMEOUT))
        new = start_again(old.replica_id, 2)
        replicas[k] = new
        new.expect("ready", time.monotonic() + READY_TIMEOUT)
    return outputs


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
    restarted: list[dict[str, Any]] = []
    restarter = None
    if plan.schedule == "rolling":
        restarter = threading.Thread(
            target=lambda: restarted.extend(
                restart_in_turn(
                    replicas,
                    first,
                    end,
                    lambda replica_id, gen: start_replica(
                        plan, url, rundir, python, replica_id, gen
                    ),
                )
            ),
            daemon=True,
        )
    with server.connect(server.monitor_db) as conn:
        # The window opens and closes half a second before a tick: it holds the work of the
        # measured ticks (claimed a little ahead of them) and of no others.
        sleep_until(first - 0.5)
        pids = [replica.proc.pid for replica in replicas]
        before = snapshot(server, conn, db, pids)
        if restarter is not None:
            restarter.start()
        while time.time() < end - 0.5:
            seen |= connections(conn, db)  # the most seen of each
            sleep_until(min(end - 0.5, time.time() + 0.5))
        if restarter is not None:
            restarter.join()  # the CPU of the replicas stopped meanwhile is not counted
        after = snapshot(server, conn, db, [replica.proc.pid for replica in replicas])
    sleep_until(end + plan.drain)  # late runs of the measured ticks
    outputs = stop_replicas(replicas) + restarted
    result = Result(plan)
    account(result, server, before, after, seen)
    analyse_samples(result, outputs, first, end)
    if plan.library == "replicron":
        analyse_ledger(result, url, first, end)
    progress(
        f"  {plan.library:<12} {plan.jobs:>5,} {plan.schedule:<12} "
        f"{time.monotonic() - began:5.1f} s, other load {result.other_load:.2f} cores"
    )
    return result


def account(
    result: Result, server: Server, before: Snapshot, after: Snapshot, seen: Counter[str]
) -> None:
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

    replica_cpu = sum(
        cpu - before.replica_cpu.get(pid, 0.0) for pid, cpu in after.replica_cpu.items()
    )
    server_cpu = server_spent(server, before, after)
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
    if result.plan.schedule != "hourly":
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
            Plan("replicron", 600, "rolling", 16, WARMUP, 3, args.rolling_task_ms),
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
        Plan("replicron", 600, "rolling", max(seconds, 40.0), warmup, drain, args.rolling_task_ms),
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
    parser.add_argument(
        "--rolling-task-ms",
        type=float,
        default=ROLLING_TASK_MS,
        help="the rolling restart's task length (ms)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="window of the bursts (s)")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=WARMUP, help="s before each window")
    parser.add_argument("--long", action="store_true", help="1 job: 300 s measured, not 60")
    parser.add_argument("--one-seconds", type=float, help="1 job: this window (s)")
    parser.add_argument("--no-apscheduler", action="store_true")
    parser.add_argument(
        "--only", choices=("every-second", "rolling", "hourly"), help="these scenarios alone"
    )
    parser.add_argument("--plot", type=Path, help="default: docs/img/pg_scale_lateness.png")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if a target fails")
    parser.add_argument("--keep-logs", action="store_true", help="keep the replicas' stderr")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)
    chosen = [p for p in plans(args) if args.only in (None, p.schedule)]
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
    lines = header(results, server, args.quick)
    text, checks = render(results, lines)
    print(text)
    progress(f"took {time.monotonic() - began:.0f} s")
    plot_path = args.plot or (None if args.quick else ROOT / "docs/img/pg_scale_lateness.png")
    if plot_path is not None:
        progress(plot(results, plot_path, f"{lines[0]}, {os.cpu_count()} cores"))
    failed = any(check.passed is False for check in checks)
    return 1 if failed and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
