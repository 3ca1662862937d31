"""The command job of the daemon fencing test: a program and its grandchild, in the process
group the daemon made for the run, that both write a line every ~100 ms while they live.

``python worker.py LINES SECONDS``

The program starts a copy of itself as its grandchild (``... LINES SECONDS grandchild``, in the
same process group: nothing here makes a group or a session of its own), then both append one
JSON line at a time to LINES (``O_APPEND``, one ``write`` per line: lines never interleave, and
a process killed with SIGKILL leaves no half line) until SECONDS have passed. Each line has
``role`` ("command" or "grandchild"), ``replica`` and ``run_id`` (``REPLICRON_REPLICA_ID``,
``REPLICRON_RUN_ID``), ``pid``, ``pgid``, ``wall`` (``time.time()``) and ``mono``
(``time.monotonic()``, one clock for every process of the machine).

Nothing ties the grandchild's life to the program's (no ``PR_SET_PDEATHSIG``): only a kill of
the whole group stops both before their time, which is what the test looks for. SECONDS bounds
a process that escaped anyway; the test's teardown kills leftovers by pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

INTERVAL = 0.1


def write_line(fd: int, role: str) -> None:
    record = {
        "role": role,
        "replica": os.environ.get("REPLICRON_REPLICA_ID", ""),
        "run_id": os.environ.get("REPLICRON_RUN_ID", ""),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "wall": time.time(),
        "mono": time.monotonic(),
    }
    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def main(argv: list[str]) -> int:
    lines, seconds = argv[1], float(argv[2])
    role = argv[3] if len(argv) > 3 else "command"
    fd = os.open(lines, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    child = None
    if role == "command":
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *argv[1:3], "grandchild"]
        )
        print(f"started, grandchild {child.pid}", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        write_line(fd, role)
        time.sleep(INTERVAL)
    if child is not None:
        child.wait()
        print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
