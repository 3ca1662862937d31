"""Command-job overhead benchmark: what keeping a command's process group in reach costs per
run, side by side in one run.

    .venv/bin/python bench/command_overhead.py            # full run (about 1 minute)
    .venv/bin/python bench/command_overhead.py --quick    # smoke test (about 15 s)

Each way is measured in a fresh child process of its own (this same file with ``--child``),
so that CPU time and reaped children belong to it alone; the child prints one JSON object on
its last stdout line. The ways, each spawning ``/bin/true`` on an asyncio loop with its output
piped, in a process group of its own, and waiting for it, one run after the other:

* ``bare``: nothing more: the floor.
* ``guard``: the old way, a Python guard (``python -I -S``, ``bench/_guard_per_run.py``)
  leading each group and starting the program.
* ``reaper``: the way the daemon does it now, one reaper process per daemon
  (``replicron.daemon._reaper``) told of each group and of its end; its CPU is counted
  (from /proc), its one start is not (reported apart).
* ``command``: the daemon's whole command task (``CommandTask``: the reaper, the output
  pumps, the group's end), for reference.

Figures: CPU per run (the child's own CPU, its reaped children's and the reaper's), wall
time per run, and the resident memory of what runs beside the program: with 10 runs in
flight (``sleep 1``), the RSS of the benchmark's descendants per run in flight (the reaper's,
once per daemon, apart). Each is given
as a ratio to ``bare`` from the same run. A round measures every way once; the median of
the rounds is shown. Target: the reaper adds at most 3 ms of CPU per run to a bare spawn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

WAYS = ("bare", "guard", "reaper", "command")
GUARD = Path(__file__).resolve().with_name("_guard_per_run.py")
PROGRAM = ("/bin/true",)
IN_FLIGHT = 10
#: CPU per run the reaper may add to a bare spawn (ms).
TARGET_MS = 3.0
Result = dict[str, Any]


# ---- one way, in a child process -----------------------------------------------------------


class Way:
    """Start a program, wait for it, and clean up, as one way does."""

    def __init__(self, name: str) -> None:
        self.name = name
        from replicron.daemon import command

        self.command = command
        self.reaper = command._REAPER

    async def run(self, argv: tuple[str, ...]) -> None:
        if self.name == "command":
            await self._command_task(argv)
            return
        if self.name == "guard":
            argv = (sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), "-", *argv)
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if self.name == "reaper":
            self.reaper.add(process.pid, None)
        await process.communicate()
        if self.name == "reaper":
            self.command._kill_group(process.pid, 9)
            await self.command._gone(process.pid, "bench")
            self.reaper.remove(process.pid)

    async def _command_task(self, argv: tuple[str, ...]) -> None:
        from replicron.context import RunContext, _current

        _current.set(RunContext("bench", datetime.now(UTC), 1, "bench", None))
        await self.command.CommandTask("bench", argv)()

    def reaper_cpu(self) -> float:
        """CPU seconds the reaper process has used so far (0 without one)."""
        pid = self.reaper.pid
        if pid is None or self.name not in ("reaper", "command"):
            return 0.0
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants_rss(root: int) -> int:
    """Resident bytes of every descendant of ``root`` (from /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as statm:
                rss[int(entry)] = int(statm.read().split()[1]) * page
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
    total = 0
    for pid in rss:
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor != root and ancestor > 1:
            ancestor = parents.get(ancestor)
        if ancestor == root:
            total += rss[pid]
    return total


async def child(name: str, runs: int) -> Result:
    way = Way(name)
    for _ in range(max(10, runs // 10)):  # warm up (and start the reaper)
        await way.run(PROGRAM)
    reaper_started = way.reaper_cpu()
    own, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    for _ in range(runs):
        await way.run(PROGRAM)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    reaper = way.reaper_cpu() - reaper_started
    cpu = time.process_time() - own + reaped + reaper

    # Memory: IN_FLIGHT runs of `sleep 1` at once, the descendants' RSS sampled in between.
    flying = [asyncio.ensure_future(way.run(("sleep", "1"))) for _ in range(IN_FLIGHT)]
    await asyncio.sleep(0.6)
    rss = descendants_rss(os.getpid())
    reaper_rss = 0
    if way.reaper_cpu():  # this way has a reaper: its memory is the daemon's, not the runs'
        with open(f"/proc/{way.reaper.pid}/statm") as statm:
            reaper_rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    await asyncio.gather(*flying)
    return {
        "way": name,
        "runs": runs,
        "cpu_ms_per_run": cpu / runs * 1e3,
        "wall_ms_per_run": wall / runs * 1e3,
        "reaper_ms_per_run": reaper / runs * 1e3,
        "reaper_start_ms": reaper_started * 1e3,
        "rss_mb_per_run_in_flight": (rss - reaper_rss) / IN_FLIGHT / 2**20,
        "reaper_rss_mb": reaper_rss / 2**20,
    }


# ---- the parent: every way, side by side -----------------------------------------------------


def run_child(name: str, runs: int) -> Result:
    done = subprocess.run(
        [sys.executable, __file__, "--child", name, "--runs", str(runs)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {name} child failed:\n{done.stdout}{done.stderr}")
    result: Result = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short smoke-test run")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if the target fails")
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args.child, args.runs))))
        return 0
    if not sys.platform.startswith("linux"):
        raise SystemExit("this benchmark reads /proc: Linux only")

    runs, rounds = (200, 1) if args.quick else (500, 3)
    print(
        f"Python {platform.python_version()} on {platform.machine()} {platform.system()}, "
        f"{os.cpu_count()} cores; {'quick' if args.quick else 'full'} run: {runs} runs of "
        f"{PROGRAM[0]} per way and round, {rounds} round(s)",
        file=sys.stderr,
    )
    found: dict[str, list[Result]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            found[way].append(run_child(way, runs))

    def median(way: str, key: str) -> float:
        return float(statistics.median(result[key] for result in found[way]))

    figures = (
        ("CPU per run (ms)", "cpu_ms_per_run", 2),
        ("wall per run (ms)", "wall_ms_per_run", 2),
        (f"RSS per run in flight (MB, {IN_FLIGHT} at once)", "rss_mb_per_run_in_flight", 1),
    )
    print(f"{'':<38}" + "".join(f"{way:>10}" for way in WAYS))
    for label, key, digits in figures:
        print(f"{label:<38}" + "".join(f"{median(way, key):>10.{digits}f}" for way in WAYS))
        bare = median("bare", key)
        print(
            f"{'  ratio to bare':<38}"
            + "".join(f"{median(way, key) / bare:>10.2f}" for way in WAYS)
        )
    print(
        f"the reaper's own CPU: {median('reaper', 'reaper_ms_per_run'):.3f} ms per run, "
        f"{median('reaper', 'reaper_start_ms'):.0f} ms for its start, "
        f"{median('reaper', 'reaper_rss_mb'):.1f} MB resident (once per daemon)"
    )
    added = median("reaper", "cpu_ms_per_run") - median("bare", "cpu_ms_per_run")
    passed = added <= TARGET_MS
    print(
        f"{'PASS' if passed else 'FAIL'}  reaper CPU above a bare spawn: {added:.2f} ms per run"
        f" (at most {TARGET_MS:g})"
    )
    return 0 if passed or args.no_check else 1


if __name__ == "__main__":
    sys.exit(main())
