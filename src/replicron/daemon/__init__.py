"""The replicron daemon: ``replicron run jobs.toml`` runs the jobs of a TOML config (commands
or Python callables) on N replicas, each tick once; ``replicron check jobs.toml`` validates a
config and prints each job's next fire times. See docs/daemon.md."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import sys
from typing import TextIO
from zoneinfo import ZoneInfo

from ._daemon import Daemon, load_checked
from ._logs import setup_logging
from .command import CommandFailed, CommandTask
from .config import (
    ConfigError,
    DaemonConfig,
    JobConfig,
    SchedulerConfig,
    load_config,
    with_replica_id,
)

__all__ = [
    "CommandFailed",
    "CommandTask",
    "ConfigError",
    "DaemonConfig",
    "JobConfig",
    "SchedulerConfig",
    "check_config",
    "load_config",
    "run_daemon",
]


def _loaded(path: str, out: TextIO) -> DaemonConfig | None:
    config, problems, _ = asyncio.run(load_checked(path))
    for line in problems:
        print(line, file=out)
    return config


def run_daemon(path: str) -> int:
    """Run the daemon on the config at ``path`` until SIGTERM or SIGINT; the exit status:
    0 after a graceful stop, 2 for a bad config (one line per problem), 1 when it could not
    start (backend unreachable)."""
    # Signals that come before the event loop's handlers are set: a reload is moot (the
    # config is being read), a stop is kept and acted on once the loop runs, rather than
    # killing the process (their default actions) or raising KeyboardInterrupt.
    early: list[int] = []
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _: early.append(received))
    config = _loaded(path, sys.stderr)
    if config is None:
        return 2
    assert config is not None
    settings = config.scheduler
    replica = settings.replica_id or f"{socket.gethostname()}:{os.getpid()}"
    if settings.replica_id is None:
        config = with_replica_id(config, replica)
    setup_logging(settings.log_level, settings.log_format, replica)
    return asyncio.run(Daemon(config, early).run())


def check_config(path: str, *, count: int = 3, out: TextIO = sys.stdout) -> int:
    """Validate the config at ``path`` as the daemon would, and print each job's next
    ``count`` fire times; 0 when it is valid, 2 (with one line per problem) when not."""
    config, problems, upcoming_runs = asyncio.run(load_checked(path, count))
    if problems:
        for line in problems:
            print(line, file=out)
        return 2
    assert config is not None
    settings = config.scheduler
    backend = (
        f"PostgreSQL (namespace {settings.namespace!r}, {settings.coordination} coordination)"
        if settings.database_url
        else f"embedded (state in {os.path.abspath(settings.state_dir or '.replicron')})"
    )
    print(f"{path}: {len(config.jobs)} jobs on {backend}, time zone {settings.timezone}", file=out)
    for job in config.jobs:
        zone = ZoneInfo(job.tz or settings.timezone)  # each job's fire times in its own zone
        what = shlex.join(job.command) if job.command is not None else f"call {job.call}"
        print(f"  {job.name}: {job.trigger} = {job.schedule!r}; runs {what}", file=out)
        for instant in upcoming_runs[job.name]:
            print(f"    {instant.astimezone(zone).isoformat()}", file=out)
        if job.trigger == "after":  # the ticks after the first follow the finishes
            print(f"    (if none is recorded yet; then {job.schedule} after each finish)", file=out)
        elif not upcoming_runs[job.name]:
            print("    (no more fire times)", file=out)
    print(f"OK: {path} is valid", file=out)
    return 0
