"""Cron "next fire time" benchmark: replicron against cronsim and croniter, in one run.

    .venv/bin/python bench/cron_next.py
    .venv/bin/python bench/cron_next.py --calls 2000 --repeats 3   # quicker

For each expression and zone, every library computes CALLS consecutive fire times starting
at 2026-01-01 00:00 in that zone, the way a scheduler would:

* replicron: ``t = trigger.next_after(t)``;
* cronsim: ``next(it)`` on ``CronSim(expr, start)``;
* croniter: ``it.get_next(datetime)`` on ``croniter(expr, start)``.

The timed region includes building the trigger / iterator (negligible next to the calls).
Each measurement is repeated REPEATS times and the best is kept; replicron's per-zone
transition cache is process-wide by design, so its repeats run warm (a cold first
measurement is among the repeats, but never the best). The table gives milliseconds for all
calls, microseconds per call and the ratio to replicron (above 1 = slower than replicron).
All three libraries must end on the same instant; a WARNING row says when they do not.

Exit status 1 when replicron is not the fastest library on some expression and zone, so the
script can act as a check.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo

from croniter import croniter
from cronsim import CronSim

from replicron import cron

EXPRESSIONS = ("*/5 * * * *", "0 3 * * 1-5")
ZONES = ("UTC", "Europe/Kyiv")
LIBRARIES = ("replicron", "cronsim", "croniter")

Runner = Callable[[str, tzinfo, datetime, int], datetime]


def run_replicron(expression: str, zone: tzinfo, start: datetime, calls: int) -> datetime:
    trigger = cron(expression, tz=zone)
    t = start
    for _ in range(calls):
        found = trigger.next_after(t)
        if found is None:
            raise RuntimeError(f"{expression!r} stopped firing after {t}")
        t = found
    return t


def run_cronsim(expression: str, zone: tzinfo, start: datetime, calls: int) -> datetime:
    it = CronSim(expression, start)
    t = start
    for _ in range(calls):
        t = next(it)
    return t


def run_croniter(expression: str, zone: tzinfo, start: datetime, calls: int) -> datetime:
    it = croniter(expression, start)
    t: datetime = start
    for _ in range(calls):
        t = it.get_next(datetime)
    return t


RUNNERS: dict[str, Runner] = {
    "replicron": run_replicron,
    "cronsim": run_cronsim,
    "croniter": run_croniter,
}


def zone_for(name: str) -> tzinfo:
    return UTC if name == "UTC" else ZoneInfo(name)


def measure(
    runner: Runner, expression: str, zone: tzinfo, calls: int, repeats: int
) -> tuple[float, datetime]:
    """Best wall time in seconds over ``repeats`` runs, and the last instant (UTC)."""
    start = datetime(2026, 1, 1, tzinfo=zone)
    best = float("inf")
    last = start
    for _ in range(repeats):
        gc.collect()
        began = time.perf_counter()
        last = runner(expression, zone, start, calls)
        best = min(best, time.perf_counter() - began)
    return best, last.astimezone(UTC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=10_000, help="next() calls per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement")
    args = parser.parse_args(argv)
    calls: int = args.calls
    repeats: int = args.repeats

    print(f"{calls:,} consecutive next() calls from 2026-01-01, best of {repeats}")
    print()
    print("| expression | zone | library | ms | µs/call | ratio to replicron |")
    print("|---|---|---|---:|---:|---:|")
    slower: list[str] = []
    for expression in EXPRESSIONS:
        for zone_name in ZONES:
            zone = zone_for(zone_name)
            results = {
                library: measure(RUNNERS[library], expression, zone, calls, repeats)
                for library in LIBRARIES
            }
            ours = results["replicron"][0]
            for library in LIBRARIES:
                seconds, _ = results[library]
                print(
                    f"| `{expression}` | {zone_name} | {library} | {seconds * 1e3:.1f} "
                    f"| {seconds * 1e6 / calls:.2f} | {seconds / ours:.2f} |"
                )
            lasts = {library: last for library, (_, last) in results.items()}
            if len(set(lasts.values())) != 1:
                detail = ", ".join(f"{lib} {last:%Y-%m-%d %H:%M}Z" for lib, last in lasts.items())
                row = f"| `{expression}` | {zone_name} | WARNING"
                print(f"{row} | last instants differ: {detail} | | |")
            fastest = min(LIBRARIES, key=lambda library: results[library][0])
            if fastest != "replicron":
                slower.append(f"`{expression}` in {zone_name}: {fastest} is faster")
    print()
    if slower:
        print("FAIL: replicron is not the fastest on every row:")
        for line in slower:
            print(f"  {line}")
        return 1
    print("PASS: replicron is the fastest on every row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
