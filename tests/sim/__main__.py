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


def _run(job: tuple[int, Any, str | None, bool]) -> Outcome:
    seed, mode, mutation, statements = job
    if mutation is None:
        return simulate(seed, mode, None, statements)
    return found_by(mutation, seed, mode, statements)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/simulate", description=__doc__)
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds, from 0")
    parser.add_argument("--seed", type=int, help="one seed, with its whole trace")
    parser.add_argument("--mode", choices=MODES, help="one mode (default: both)")
    parser.add_argument("--mutation", choices=sorted(MUTATIONS), help="an old fault put back")
    parser.add_argument(
        "--statements", action="store_true", help="with --seed: every statement in the trace"
    )
    parser.add_argument("--first", action="store_true", help="stop at the first failing seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    args = parser.parse_args(argv)
    modes = [args.mode] if args.mode else list(MODES)
    seeds = [args.seed] if args.seed is not None else list(range(args.seeds))
    work = [(seed, mode, args.mutation, args.statements) for seed in seeds for mode in modes]
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
    summary = f"{len(work)} runs ({len(seeds)} seeds), {failed} failed, {statements} statements"
    if args.seed is None:  # a replayed trace stays the same, line for line
        summary += f", {time.monotonic() - began:.1f} s"
    print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
