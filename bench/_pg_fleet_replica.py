"""One replica process for bench/pg_fleet.py: replicron on PostgreSQL with N jobs due together
every ``--period`` seconds.

    python bench/_pg_fleet_replica.py --dsn URL --replica-id r01 --jobs 2000 --period 10 \
        --task-ms 5 --out r01.json

Started by pg_fleet.py, never by hand. It registers the same jobs as its peers (``job-0000``
..., ``every(seconds=period)``, so all of them fall due at the same instants), starts the
scheduler with its defaults and prints ``ready``. On a line on stdin (or its end, or SIGTERM)
it shuts the scheduler down, writes what it measured to ``--out`` (one JSON object) and prints
``stopped``. Each task notes its first ``time.time()`` and its tick, in memory; a listener
counts per tick the ``on_taken`` answers (another replica inserted the tick's row first), the
misses and the skips.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from _pg_scale_replica import stop_requested
from _replicron_counting import Counting

import replicron
from replicron.postgres import PostgresBackend

#: (job index, tick as Unix seconds, task start as Unix seconds); list.append is atomic.
SAMPLES: list[tuple[int, float, float]] = []
TASK_SECONDS = 0.005


def task(index: int) -> None:
    started = time.time()
    SAMPLES.append((index, replicron.current_run().scheduled_at.timestamp(), started))
    time.sleep(TASK_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
    global TASK_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--period", type=int, required=True, help="seconds between ticks")
    parser.add_argument("--task-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--coordination", choices=("advisory", "lease"), default="advisory")
    args = parser.parse_args(argv)
    TASK_SECONDS = args.task_ms / 1000.0
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = stop_requested()
    counting = Counting()
    began = time.monotonic()
    scheduler = replicron.Scheduler(
        backend=PostgresBackend(args.dsn, migrate=False, coordination=args.coordination),
        replica_id=args.replica_id,
        listeners=[counting],
    )
    trigger = replicron.every(seconds=args.period)
    for index in range(args.jobs):
        scheduler.add_job(trigger, task, index, name=f"job-{index:04d}")
    scheduler.start()
    start_s = time.monotonic() - began
    print("ready", flush=True)
    stop.wait()
    began = time.monotonic()
    scheduler.shutdown()
    result = {
        "replica_id": args.replica_id,
        "start_s": start_s,
        "shutdown_s": time.monotonic() - began,
        "samples": SAMPLES,
        **counting.counts(),
    }
    args.out.write_text(json.dumps(result, separators=(",", ":")))
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
