"""A stand-in for the daemon: runs one command job's task (``CommandTask``) as the daemon
does, without a scheduler or a backend, so that tests can kill or freeze it.

``python stand_in.py LEASE_S RENEW_S PROGRAM ARGS...``

``LEASE_S`` (``-`` for none): the run holds a lease that ends this many seconds after it
starts; ``RENEW_S``: a heartbeat renews it (for ``LEASE_S`` more) that many seconds in
(``-``: never). Each lease end is printed as ``lease END`` (``time.monotonic()``), the
reaper's pid as ``reaper PID``, the group's as ``group PID``; the program's output goes to
stderr through the daemon's logging; the run's end is printed as ``ended STATUS``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from datetime import UTC, datetime

from replicron.context import RunContext, _current
from replicron.daemon import command
from replicron.daemon.command import CommandFailed, CommandTask


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(lease_s: str, renew_s: str, argv: list[str]) -> None:
    run = RunContext("job", datetime.now(UTC), 1, "stand-in", None)
    if lease_s != "-":
        ends = [time.monotonic() + float(lease_s)]
        run._lease_end = lambda: ends[0]
        say(f"lease {ends[0]!r}")
        if renew_s != "-":

            def renew() -> None:
                ends[0] = time.monotonic() + float(lease_s)
                say(f"lease {ends[0]!r}")

            asyncio.get_running_loop().call_later(float(renew_s), renew)
    _current.set(run)
    task = asyncio.ensure_future(CommandTask("job", argv)())
    while not command._REAPER._groups:
        await asyncio.sleep(0.01)
    say(f"reaper {command._REAPER.pid}")
    say(f"group {next(iter(command._REAPER._groups))}")
    try:
        await task
        say("ended 0")
    except CommandFailed as exc:
        say(f"ended {exc}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
