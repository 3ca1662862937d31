"""``python -m tests.sim``: run seeds of the simulator (see ``bash scripts/simulate``)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any

from .mutations import MUTATIONS
from .simulation import Outcome, found_by, simulate

MODES = ("advisory", "lease")


def _run(job: tuple[int, Any, str | None, bool, bool]) -> Outcome:
    seed, mode, mutation, statements, whole = job
    if mutation is None:
        outcome = simulate(seed, mode, None, statements)
    else:
        outcome = found_by(mutation, seed, mode, statements)
    if outcome.ok and not whole:
        outcome.trace = []  # nobody reads it: not worth carrying back from the worker
    return outcome


def mode_of(seed: int) -> str:
    """The coordination mode a seed's world runs in: even seeds advisory locks, odd seeds
    row leases, so any range of seeds covers both."""
    return MODES[seed % 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/simulate", description=__doc__)
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds, from 0")
    parser.add_argument("--seed", type=int, help="one seed, with its whole trace")
    parser.add_argument(
        "--mode",
        choices=MODES,
        help="every seed in this mode (default: even seeds advisory, odd lease)",
    )
    parser.add_argument("--mutation", choices=sorted(MUTATIONS), help="an old fault put back")
    parser.add_argument(
        "--statements", action="store_true", help="with --seed: every statement in the trace"
    )
    parser.add_argument("--first", action="store_true", help="stop at the first failing seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.seeds))
    whole = args.seed is not None
    work = [
        (seed, args.mode or mode_of(seed), args.mutation, args.statements, whole) for seed in seeds
    ]
    began = time.monotonic()
    failed, statements = 0, 0
    with multiprocessing.get_context("fork").Pool(max(1, min(args.jobs, len(work)))) as pool:
        for outcome in pool.imap(_run, work):
            statements += outcome.statements
            if args.seed is not None:
                print("\n".join(outcome.trace))
            if not outcome.ok:
                failed += 1
                print(outcome.report(), flush=True)
                if args.first:
                    pool.terminate()
                    break
    summary = f"{len(seeds)} seeds, {failed} failed, {statements} statements"
    if args.seed is None:  # a replayed trace stays the same, line for line
        summary += f", {time.monotonic() - began:.1f} s"
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
