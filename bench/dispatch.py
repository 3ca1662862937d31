"""Dispatch benchmark: replicron against APScheduler 3.11, side by side in one run.

    .venv/bin/python bench/dispatch.py            # full run (about 2.5 minutes)
    .venv/bin/python bench/dispatch.py --quick    # smoke test (about 45 s)

Every measurement runs in a fresh child process of its own (this same file with ``--child``),
so that memory and CPU time belong to one library alone; the child prints one JSON object on
its last stdout line and the parent prints the table, the ratios replicron / APScheduler and
a PASS/FAIL line per target. Exit status 1 when a target fails (unless ``--no-check``).

Scenarios (see docs/benchmarks.md for what each figure means):

* ``dispatch``: N jobs, each due every whole second, a trivial sync task. Lateness = the
  task's first ``time.time()`` minus the tick it runs for. CPU = ``time.process_time()`` of
  the whole process over the measured seconds, per 1,000 runs. replicron runs once more with
  ``defer_gc=True`` (opt-in: the collector held back while an instant's runs start), for its
  p99 beside the default's (shown, not checked).
* ``register``: N hourly jobs added to a started scheduler: wall time of the adding loop,
  resident memory growth per job, then the process's CPU time while idle.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

LIBRARIES = ("replicron", "apscheduler")
#: Cores' worth of CPU used by other processes during a measurement above which the
#: results are flagged as unreliable.
BUSY_MACHINE = 0.25
Result = dict[str, Any]


# ---- measuring helpers (child side) ---------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sleep_until(instant: float) -> None:
    while (remaining := instant - time.time()) > 0:
        time.sleep(remaining)


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (``nan`` when empty)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def noop() -> None:
    """The task of the hourly jobs (they never run during the benchmark)."""


class Samples:
    """(tick, task start) pairs, both Unix seconds; ``list.append`` is thread-safe."""

    def __init__(self) -> None:
        self.items: list[tuple[float, float]] = []

    def in_window(self, first: float, end: float) -> list[tuple[float, float]]:
        return [item for item in list(self.items) if first <= item[0] < end]


# ---- the two libraries behind one small interface -------------------------------------------


class Harness:
    """Start a scheduler, add jobs to it, stop it: the only library-specific code."""

    version = ""

    def __init__(self) -> None:
        self.samples = Samples()

    def start(self) -> None:
        raise NotImplementedError

    def add_ticking(self, index: int) -> None:
        """A job due every whole second whose runs land in ``self.samples``."""
        raise NotImplementedError

    def add_hourly(self, index: int) -> None:
        raise NotImplementedError

    def job_count(self) -> int:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError


class ReplicronHarness(Harness):
    def __init__(self, defer_gc: bool = False) -> None:
        super().__init__()
        import replicron

        self.version = replicron.__version__
        self._replicron = replicron
        self._scheduler = replicron.Scheduler(defer_gc=True) if defer_gc else replicron.Scheduler()
        append = self.samples.items.append
        current_run = replicron.current_run

        def task() -> None:
            started = time.time()
            append((current_run().scheduled_at.timestamp(), started))

        self._task = task

    def start(self) -> None:
        self._scheduler.start()

    def add_ticking(self, index: int) -> None:
        every = self._replicron.every
        self._scheduler.add_job(every(seconds=1), self._task, name=f"tick-{index:06d}")

    def add_hourly(self, index: int) -> None:
        cron = self._replicron.cron
        self._scheduler.add_job(cron("0 * * * *"), noop, name=f"hourly-{index:06d}")

    def job_count(self) -> int:
        return len(self._scheduler.jobs())

    def shutdown(self) -> None:
        self._scheduler.shutdown()


class APSchedulerHarness(Harness):
    """APScheduler 3.11: ``BackgroundScheduler``, default thread pool executor (10 threads),
    ``misfire_grace_time=None``; coalescing and ``max_instances=1`` left at their defaults.

    The task returns its start time; an ``EVENT_JOB_EXECUTED`` listener (run on the worker
    thread right after the task) pairs it with the event's ``scheduled_run_time``.
    """

    def __init__(self) -> None:
        super().__init__()
        # Imported here so that the replicron child never loads APScheduler. Through
        # importlib because APScheduler ships no type information: its objects are Any.
        aps: Any = importlib.import_module("apscheduler")
        events: Any = importlib.import_module("apscheduler.events")
        background: Any = importlib.import_module("apscheduler.schedulers.background")
        triggers_cron: Any = importlib.import_module("apscheduler.triggers.cron")
        triggers_interval: Any = importlib.import_module("apscheduler.triggers.interval")
        self.version = str(aps.__version__)
        self._cron_trigger = triggers_cron.CronTrigger
        self._interval_trigger = triggers_interval.IntervalTrigger
        self._scheduler = background.BackgroundScheduler(
            timezone=UTC, job_defaults={"misfire_grace_time": None}
        )
        self.skipped = 0
        append = self.samples.items.append
        executed, max_instances = events.EVENT_JOB_EXECUTED, events.EVENT_JOB_MAX_INSTANCES

        def listener(event: Any) -> None:
            if event.code == executed:
                append((event.scheduled_run_time.timestamp(), event.retval))
            else:
                self.skipped += 1

        self._scheduler.add_listener(listener, executed | max_instances)
        # Whole seconds, like replicron's every(seconds=1) (anchored at the Unix epoch).
        self._grid = datetime.fromtimestamp(math.floor(time.time()), UTC)

    def start(self) -> None:
        self._scheduler.start()

    def add_ticking(self, index: int) -> None:
        trigger = self._interval_trigger(seconds=1, start_date=self._grid, timezone=UTC)
        self._scheduler.add_job(time.time, trigger, id=f"tick-{index:06d}")

    def add_hourly(self, index: int) -> None:
        trigger = self._cron_trigger(minute=0, timezone=UTC)
        self._scheduler.add_job(noop, trigger, id=f"hourly-{index:06d}")

    def job_count(self) -> int:
        return len(self._scheduler.get_jobs())

    def shutdown(self) -> None:
        self._scheduler.shutdown()


HARNESSES: dict[str, Callable[[], Harness]] = {
    "replicron": ReplicronHarness,
    "apscheduler": APSchedulerHarness,
    # Not compared: how replicron fares with the collector left alone (see docs).
    "replicron-defer-gc": lambda: ReplicronHarness(defer_gc=True),
}


# ---- the scenarios (child side) -------------------------------------------------------------


def run_dispatch(harness: Harness, jobs: int, seconds: int) -> Result:
    harness.start()
    for index in range(jobs):
        harness.add_ticking(index)
    # Warm-up: the next tick and the one after it are not measured, so the window opens at
    # least one whole second after the last job was added.
    first = math.ceil(time.time()) + 2
    end = first + seconds
    # The CPU window spans the bursts of ticks first .. end-1: it opens and closes half a
    # second before a tick, when the previous burst is normally over (in a steady state a
    # longer burst is cut equally at both ends).
    sleep_until(first - 0.5)
    cpu_start = time.process_time()
    sleep_until(end - 0.5)
    cpu = time.process_time() - cpu_start
    expected = jobs * seconds
    # Let late runs of the measured ticks finish (not counted in the CPU time).
    drain_deadline = end + 10.0
    window = harness.samples.in_window(first, end)
    while len(window) < expected and time.time() < drain_deadline:
        time.sleep(0.2)
        window = harness.samples.in_window(first, end)
    harness.shutdown()
    lateness = sorted((started - tick) * 1000.0 for tick, started in window)
    runs = len(lateness)
    return {
        "jobs": jobs,
        "seconds": seconds,
        "expected_runs": expected,
        "runs": runs,
        "skipped": getattr(harness, "skipped", None),
        "p50_ms": percentile(lateness, 0.50),
        "p99_ms": percentile(lateness, 0.99),
        "max_ms": lateness[-1] if lateness else math.nan,
        "cpu_s": cpu,
        "cpu_s_per_1k_runs": cpu / runs * 1000.0 if runs else math.nan,
    }


def run_register(harness: Harness, jobs: int, idle: float) -> Result:
    harness.start()
    gc.collect()
    rss_before = rss_bytes()
    started = time.perf_counter()
    for index in range(jobs):
        harness.add_hourly(index)
    add_s = time.perf_counter() - started
    time.sleep(1.0)  # let the scheduler thread finish reacting to the additions
    gc.collect()
    rss_after = rss_bytes()
    cpu_start = time.process_time()
    time.sleep(idle)
    idle_cpu = time.process_time() - cpu_start
    registered = harness.job_count()
    harness.shutdown()
    return {
        "jobs": jobs,
        "registered": registered,
        "add_s": add_s,
        "add_us_per_job": add_s / jobs * 1e6,
        "rss_growth_bytes": rss_after - rss_before,
        "rss_bytes_per_job": (rss_after - rss_before) / jobs,
        "idle_seconds": idle,
        "idle_cpu_s": idle_cpu,
    }


def child_main(library: str, scenario: str, jobs: int, seconds: float) -> None:
    harness = HARNESSES[library]()
    if scenario == "dispatch":
        result = run_dispatch(harness, jobs, int(seconds))
    else:
        result = run_register(harness, jobs, seconds)
    result["library"] = library
    result["version"] = harness.version
    print(json.dumps(result), flush=True)


# ---- the parent: run the children, print the table, check the targets ----------------------


def busy_seconds() -> float:
    """CPU seconds all processes of the machine have used, from /proc/stat (Linux)."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_child(library: str, scenario: str, jobs: int, seconds: float) -> Result:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        library,
        scenario,
        "--jobs",
        str(jobs),
        "--seconds",
        str(seconds),
    ]
    print(
        f"  {library:<11} {scenario:<8} {jobs:>7,} jobs ...", end=" ", flush=True, file=sys.stderr
    )
    began, busy_before, child_before = time.monotonic(), busy_seconds(), children_cpu()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - began
    # Whatever else ran on the machine meanwhile, in cores (0 on a quiet machine).
    other = (busy_seconds() - busy_before) - (children_cpu() - child_before)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"child {library} {scenario} failed with status {done.returncode}")
    result: Result = json.loads(lines[-1])
    result["stderr_lines"] = len(done.stderr.splitlines())
    result["other_load_cores"] = max(0.0, other / elapsed)
    print(f"{elapsed:.1f} s (other load {result['other_load_cores']:.2f} cores)", file=sys.stderr)
    return result


def avoid_top_of_hour(needed: float) -> None:
    """Hourly jobs would all fire at minute 0: start a register run only well clear of it."""
    to_next_hour = 3600 - time.time() % 3600
    if to_next_hour < needed:
        print(
            f"  waiting {to_next_hour + 2:.0f} s for the top of the hour to pass", file=sys.stderr
        )
        time.sleep(to_next_hour + 2)


def ratio(ours: float, theirs: float) -> float:
    if theirs == 0 or math.isnan(ours) or math.isnan(theirs):
        return math.nan
    return ours / theirs


def fmt(value: float, digits: int) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def section(self, title: str) -> None:
        self.rows.append((title, "", "", ""))

    def row(self, label: str, ours: float, theirs: float, digits: int) -> None:
        self.rows.append(
            (f"  {label}", fmt(ours, digits), fmt(theirs, digits), fmt(ratio(ours, theirs), 3))
        )

    def info(self, label: str, ours: float, theirs: float, digits: int) -> None:
        """A row without a ratio (the ratio would mean nothing)."""
        self.rows.append((f"  {label}", fmt(ours, digits), fmt(theirs, digits), ""))

    def ours(self, label: str, value: float, digits: int) -> None:
        """A row of replicron's alone."""
        self.rows.append((f"  {label}", fmt(value, digits), "", ""))

    def render(self) -> str:
        header = ("", "replicron", "APScheduler", "ratio")
        widths = [max(len(r[i]) for r in [header, *self.rows]) for i in range(4)]
        lines = []
        for cells in [header, *self.rows]:
            label, *numbers = cells
            text = label.ljust(widths[0])
            text += "".join(f"  {n:>{w}}" for n, w in zip(numbers, widths[1:], strict=True))
            lines.append(text.rstrip())
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short smoke-test run")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if a target fails")
    parser.add_argument("--child", nargs=2, metavar=("LIBRARY", "SCENARIO"), help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        library, scenario = args.child
        if library not in HARNESSES or scenario not in ("dispatch", "register"):
            parser.error(f"unknown child {library} {scenario}")
        child_main(library, scenario, args.jobs, args.seconds)
        return 0

    seconds = 3 if args.quick else 10
    loads = (1_000, 5_000)
    hourly = 20_000 if args.quick else 100_000
    idle = 2.0 if args.quick else 5.0
    print(
        f"Python {platform.python_version()} on {platform.machine()} {platform.system()}, "
        f"{os.cpu_count()} cores; {'quick' if args.quick else 'full'} run",
        file=sys.stderr,
    )
    dispatch: dict[int, dict[str, Result]] = {}
    for jobs in loads:
        dispatch[jobs] = {
            lib: run_child(lib, "dispatch", jobs, seconds)
            for lib in (*LIBRARIES, "replicron-defer-gc")
        }
    register: dict[str, Result] = {}
    for lib in LIBRARIES:
        avoid_top_of_hour(90.0)
        register[lib] = run_child(lib, "register", hourly, idle)

    versions = {lib: register[lib]["version"] for lib in LIBRARIES}
    table = Table()
    for jobs in loads:
        r, a = dispatch[jobs]["replicron"], dispatch[jobs]["apscheduler"]
        table.section(f"{jobs:,} jobs every second, {seconds} s measured")
        table.row(f"runs (of {jobs * seconds:,})", r["runs"], a["runs"], 0)
        table.row("lateness p50 (ms)", r["p50_ms"], a["p50_ms"], 2)
        table.row("lateness p99 (ms)", r["p99_ms"], a["p99_ms"], 2)
        table.row("lateness max (ms)", r["max_ms"], a["max_ms"], 2)
        opted_in = dispatch[jobs]["replicron-defer-gc"]
        table.ours("  p99 with defer_gc=True (ms)", opted_in["p99_ms"], 2)
        table.row("CPU s per 1,000 runs", r["cpu_s_per_1k_runs"], a["cpu_s_per_1k_runs"], 4)
        table.info("other processes' load (cores)", r["other_load_cores"], a["other_load_cores"], 2)
    r, a = register["replicron"], register["apscheduler"]
    table.section(f"{hourly:,} hourly jobs added to a started scheduler")
    table.row("time to add all (s)", r["add_s"], a["add_s"], 3)
    table.row("RSS growth per job (bytes)", r["rss_bytes_per_job"], a["rss_bytes_per_job"], 0)
    table.row(f"idle CPU over {idle:g} s (ms)", r["idle_cpu_s"] * 1e3, a["idle_cpu_s"] * 1e3, 1)
    table.info("other processes' load (cores)", r["other_load_cores"], a["other_load_cores"], 2)

    checks: list[tuple[str, float, float]] = []
    for jobs in loads:
        r, a = dispatch[jobs]["replicron"], dispatch[jobs]["apscheduler"]
        checks.append((f"p99 lateness, {jobs:,} jobs", ratio(r["p99_ms"], a["p99_ms"]), 1 / 5))
        checks.append(
            (
                f"CPU per run, {jobs:,} jobs",
                ratio(r["cpu_s_per_1k_runs"], a["cpu_s_per_1k_runs"]),
                1 / 2,
            )
        )
    r, a = register["replicron"], register["apscheduler"]
    checks.append(("memory per job", ratio(r["rss_bytes_per_job"], a["rss_bytes_per_job"]), 1 / 2))
    checks.append((f"time to add {hourly:,} jobs", ratio(r["add_s"], a["add_s"]), 1 / 3))

    print(f"replicron {versions['replicron']} vs APScheduler {versions['apscheduler']}")
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"{'quick' if args.quick else 'full'} run"
    )
    print()
    print(table.render())
    for jobs in loads:
        for lib in LIBRARIES:
            result = dispatch[jobs][lib]
            if result["runs"] < result["expected_runs"]:
                print(
                    f"note: {lib}, {jobs:,} jobs: {result['expected_runs'] - result['runs']:,} "
                    "runs of the measured ticks did not happen (skipped or still queued)"
                )
    busiest = max(
        [dispatch[jobs][lib]["other_load_cores"] for jobs in loads for lib in dispatch[jobs]]
        + [register[lib]["other_load_cores"] for lib in LIBRARIES]
    )
    if busiest > BUSY_MACHINE:
        print(
            f"warning: other processes used up to {busiest:.2f} of the {os.cpu_count()} cores "
            "during a measurement; these figures are not reliable, rerun on a quiet machine"
        )
    for lib in LIBRARIES:
        if register[lib]["registered"] != hourly:
            print(f"note: {lib} reports {register[lib]['registered']:,} jobs, not {hourly:,}")
    print()
    print("Targets (ratio replicron / APScheduler)")
    failed = 0
    for label, value, limit in checks:
        passed = not math.isnan(value) and value <= limit
        failed += not passed
        verdict = "PASS" if passed else "FAIL"
        print(f"  {verdict}  {label:<28} {fmt(value, 3):>7}  (at most {limit:.3f})")
    if failed and not args.no_check:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
