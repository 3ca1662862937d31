"""A command job for the daemon acceptance tests: a program with a grandchild in its process
group, whose pids it reports, that works for a while.

``python process_group.py PIDFILE SECONDS [--ignore-term]``

* starts a grandchild ``sleep`` in its own process group (the one the daemon made for it);
* writes ``{"pid", "child", "run_id", "scheduled_at", "replica"}`` to PIDFILE as JSON, at
  once (written aside, then renamed: a reader never sees half of it), and prints ``started``;
* sleeps SECONDS, then ends the grandchild, prints ``finished`` and exits 0.

With ``--ignore-term`` it and its grandchild ignore SIGTERM (it prints ``SIGTERM ignored``
each time one comes): only SIGKILL ends them before their time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def on_term(signum: int, frame: FrameType | None) -> None:
    say("SIGTERM ignored")


def ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def main() -> int:
    pidfile, seconds = sys.argv[1], float(sys.argv[2])
    stubborn = "--ignore-term" in sys.argv[3:]
    if stubborn:
        signal.signal(signal.SIGTERM, on_term)
    child = subprocess.Popen(
        ["sleep", str(seconds + 60)], preexec_fn=ignore_term if stubborn else None
    )
    facts = {
        "pid": os.getpid(),
        "child": child.pid,
        "run_id": os.environ.get("REPLICRON_RUN_ID"),
        "scheduled_at": os.environ.get("REPLICRON_SCHEDULED_AT"),
        "replica": os.environ.get("REPLICRON_REPLICA_ID"),
    }
    with open(pidfile + ".tmp", "w") as out:
        json.dump(facts, out)
    os.replace(pidfile + ".tmp", pidfile)
    say("started")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)  # a handled SIGTERM wakes it up early: sleep the rest
    child.kill()
    child.wait()
    say("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
