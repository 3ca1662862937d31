"""One replica process for bench/pg_scale.py: replicron or APScheduler 4 on PostgreSQL.

    python bench/_pg_scale_replica.py --library replicron --dsn URL --replica-id r1 \
        --jobs 600 --schedule every-second --task-ms 5 --out r1.json

Started by pg_scale.py, three at a time, never by hand. The replica builds its scheduler,
registers the same jobs as its peers (``job-0000`` ..), starts, and prints ``ready`` on
stdout. On a line on stdin (or its end, or SIGTERM) it shuts its scheduler down cleanly,
writes what it measured to ``--out`` (one JSON object) and prints ``stopped``.

It measures in the task itself, the same way for both libraries: the task's first
``time.time()`` against the tick it runs for (replicron: ``current_run().scheduled_at``;
APScheduler 4: ``current_job.get().scheduled_fire_time``), kept in memory and written at the
end, so no I/O is on the runs' path. replicron's replicas also count, per tick, the
``on_taken`` answers (another replica inserted the tick's row first) and other events.

This file runs under two interpreters: the project's ``.venv`` (replicron) and
``bench/.venv-apscheduler4`` (APScheduler 4.0.0a6, no replicron there), so each library is
imported only inside its own branch. APScheduler is imported through importlib: the
project's mypy sees APScheduler 3 only, and version 4's objects are typed ``Any`` here.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import inspect
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: (job index, tick as Unix seconds, task start as Unix seconds); list.append is atomic.
SAMPLES: list[tuple[int, float, float]] = []
#: How long each run sleeps (set from --task-ms before the scheduler starts).
TASK_SECONDS = 0.005
#: replicron's ``current_run`` (set in the replicron branch), for its task below.
CURRENT_RUN: Any = None
#: The module of APScheduler 4 (set in the APScheduler branch), for its task below.
APS: Any = None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--library", choices=("replicron", "apscheduler4"), required=True)
    parser.add_argument("--dsn", required=True, help="a postgresql:// URL")
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--schedule", choices=("every-second", "hourly"), required=True)
    parser.add_argument(
        "--minute", type=int, default=30, help="hourly jobs fire at this minute of the hour"
    )
    parser.add_argument(
        "--anchor", type=float, default=0.0, help="APScheduler's interval start (Unix s)"
    )
    parser.add_argument("--task-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


# ---- the tasks ------------------------------------------------------------------------------


def replicron_task(index: int) -> None:
    started = time.time()
    SAMPLES.append((index, CURRENT_RUN().scheduled_at.timestamp(), started))
    time.sleep(TASK_SECONDS)


def aps_task(index: int) -> None:
    started = time.time()
    job = APS.current_job.get()
    SAMPLES.append((index, job.scheduled_fire_time.timestamp(), started))
    time.sleep(TASK_SECONDS)


def idle_task(index: int) -> None:
    """The hourly jobs' task: they are not due while measured."""


# ---- stopping -------------------------------------------------------------------------------


def stop_requested() -> threading.Event:
    """Set on a line on stdin, at its end, or on SIGTERM."""
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    return stop


def say(word: str) -> None:
    print(word, flush=True)


def job(index: int) -> str:
    """A job's name, the same in every replica (and in both libraries)."""
    return f"job-{index:04d}"


# ---- replicron ------------------------------------------------------------------------------


def run_replicron(args: argparse.Namespace, stop: threading.Event) -> dict[str, Any]:
    global CURRENT_RUN
    from _replicron_counting import Counting

    import replicron
    from replicron.postgres import PostgresBackend

    CURRENT_RUN = replicron.current_run

    counting = Counting()
    began = time.monotonic()
    scheduler = replicron.Scheduler(
        backend=PostgresBackend(args.dsn), replica_id=args.replica_id, listeners=[counting]
    )
    for index in range(args.jobs):
        if args.schedule == "every-second":
            scheduler.add_job(replicron.every(seconds=1), replicron_task, index, name=job(index))
        else:
            trigger = replicron.cron(f"{args.minute} * * * *")
            scheduler.add_job(trigger, idle_task, index, name=job(index))
    scheduler.start()
    started_s = time.monotonic() - began
    say("ready")
    stop.wait()
    began = time.monotonic()
    scheduler.shutdown()
    workers = inspect.signature(replicron.Scheduler).parameters["max_workers"].default
    return {
        "version": replicron.__version__,
        "workers": workers,
        "start_s": started_s,
        "shutdown_s": time.monotonic() - began,
        **counting.counts(),
    }


# ---- APScheduler 4 --------------------------------------------------------------------------


async def run_apscheduler(args: argparse.Namespace, stop: threading.Event) -> dict[str, Any]:
    """APScheduler 4's AsyncScheduler with its defaults (max_concurrent_jobs=100, a thread
    pool of 40 for sync tasks), an SQLAlchemy data store and an asyncpg event broker (LISTEN
    and NOTIFY) on the same database. One task per job with ``max_running_jobs=1`` (so a job
    never overlaps itself, like replicron's ``overlap="skip"``), ``misfire_grace_time=None``
    and ``coalesce=latest`` (a late tick runs however late; ticks that fell due together run
    once), as replicron's defaults."""
    global APS
    APS = aps = importlib.import_module("apscheduler")
    sqlalchemy_store: Any = importlib.import_module("apscheduler.datastores.sqlalchemy")
    asyncpg_broker: Any = importlib.import_module("apscheduler.eventbrokers.asyncpg")
    interval: Any = importlib.import_module("apscheduler.triggers.interval")
    cron: Any = importlib.import_module("apscheduler.triggers.cron")
    sqlalchemy_async: Any = importlib.import_module("sqlalchemy.ext.asyncio")

    application = {"server_settings": {"application_name": f"apscheduler4 {args.replica_id}"}}
    url = args.dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = sqlalchemy_async.create_async_engine(url, connect_args=application)
    store = sqlalchemy_store.SQLAlchemyDataStore(engine)
    broker = asyncpg_broker.AsyncpgEventBroker.from_async_sqla_engine(engine, application)
    anchor = datetime.fromtimestamp(args.anchor, UTC)
    began = time.monotonic()
    async with aps.AsyncScheduler(store, broker, identity=args.replica_id) as scheduler:
        for index in range(args.jobs):
            name = job(index)
            if args.schedule == "every-second":
                trigger, task = interval.IntervalTrigger(seconds=1, start_time=anchor), aps_task
            else:
                trigger, task = cron.CronTrigger(minute=args.minute, timezone="UTC"), idle_task
            await scheduler.configure_task(
                name,
                func=task,
                job_executor="threadpool",  # the default, "async", runs it on the loop
                max_running_jobs=1,
                misfire_grace_time=None,
            )
            await scheduler.add_schedule(
                name,
                trigger,
                id=name,
                args=(index,),
                coalesce=aps.CoalescePolicy.latest,
                misfire_grace_time=None,
                conflict_policy=aps.ConflictPolicy.do_nothing,
            )
        await scheduler.start_in_background()
        started_s = time.monotonic() - began
        say("ready")
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        began = time.monotonic()
        await scheduler.stop()
        await scheduler.wait_until_stopped()
    await engine.dispose()
    executor = scheduler.job_executors["threadpool"]
    return {
        "version": importlib.metadata.version("apscheduler"),
        "workers": executor.max_workers,
        "max_concurrent_jobs": scheduler.max_concurrent_jobs,
        "start_s": started_s,
        "shutdown_s": time.monotonic() - began,
    }


def main(argv: Sequence[str] | None = None) -> int:
    global TASK_SECONDS
    args = parse_args(argv)
    TASK_SECONDS = args.task_ms / 1000.0
    # What goes wrong, with when: WARNING and above only, so nothing on the runs' path.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = stop_requested()
    if args.library == "replicron":
        result = run_replicron(args, stop)
    else:
        result = asyncio.run(run_apscheduler(args, stop))
    result.update(library=args.library, replica_id=args.replica_id, samples=list(SAMPLES))
    args.out.write_text(json.dumps(result, separators=(",", ":")))
    say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
