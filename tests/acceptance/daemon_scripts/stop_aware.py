"""A command job for the daemon's stop tests: a program with a grandchild in its process
group, that says (as JSON lines appended to EVENTS, with ``time.monotonic()``, the host's
clock in every process) when it started and when SIGTERM came.

``python stop_aware.py EVENTS trap|ignore``

* ``trap``: on SIGTERM it cleans up for half a second, says ``cleaned`` and exits 0;
* ``ignore``: it ignores SIGTERM (saying so); only SIGKILL ends it.

Its grandchild (``sleep``) ignores SIGTERM in both cases: only the group's SIGKILL ends it,
so the group outlives a program that exits on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType

EVENTS, MODE = sys.argv[1], sys.argv[2]


def say(event: str, **facts: object) -> None:
    line = json.dumps({"event": event, "t": time.monotonic(), **facts}) + "\n"
    fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def on_term(signum: int, frame: FrameType | None) -> None:
    say("term")
    if MODE == "trap":
        time.sleep(0.5)  # cleaning up
        say("cleaned")
        os._exit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, on_term)
    child = subprocess.Popen(
        ["sleep", "300"], preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)
    )
    say("started", pid=os.getpid(), child=child.pid, run_id=os.environ["REPLICRON_RUN_ID"])
    print("started", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
