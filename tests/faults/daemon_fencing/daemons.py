"""The daemons of the fencing test (see :class:`tests._harness.daemons.Daemons`), started
directly or inside the suite's network namespace, and the lines their command jobs write (see
``worker.py``).

:meth:`Daemons.close` kills every daemon still running and then every command process that a
line names and that is still alive: a daemon killed outright takes its command with it
(``PR_SET_PDEATHSIG``), but not the command's own child.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests._harness.daemons import Daemons as DaemonProcesses
from tests._harness.daemons import config_text
from tests._harness.processes import process_start

__all__ = [
    "WORKER",
    "Daemons",
    "Line",
    "config_text",
    "process_alive",
    "read_lines",
]

WORKER = Path(__file__).resolve().parent / "worker.py"

#: Prints the HTTP status of a GET of argv[1] (0 when nothing answers), run where the daemon
#: listens: inside the namespace, its loopback works even while the namespace is cut off.
_PROBE = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as answer:
        print(answer.status)
except urllib.error.HTTPError as exc:
    print(exc.code)
except OSError:
    print(0)
"""


# ---- what the commands wrote -----------------------------------------------------------


@dataclass(frozen=True)
class Line:
    role: str  # "command" or "grandchild"
    replica: str
    run_id: str
    pid: int
    pgid: int
    wall: float
    mono: float


def read_lines(path: Path) -> list[Line]:
    """Every line the command jobs wrote so far, in the order of their wall-clock stamps."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for text in path.read_text().splitlines():
            try:
                record = json.loads(text)
            except json.JSONDecodeError:  # never expected: one write per line
                continue
            found.append(
                Line(
                    str(record["role"]),
                    str(record["replica"]),
                    str(record["run_id"]),
                    int(record["pid"]),
                    int(record["pgid"]),
                    float(record["wall"]),
                    float(record["mono"]),
                )
            )
    return sorted(found, key=lambda line: line.wall)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    return process_start(pid) is not None


def _is_worker(pid: int, lines_path: Path) -> bool:
    """Whether ``pid`` is still one of this test's command processes (not a reused pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(WORKER).encode() in argv and str(lines_path).encode() in argv


# ---- the daemons -----------------------------------------------------------------------


class Daemons(DaemonProcesses):
    """The daemons of one test; ``lines_path`` is where their command jobs write (for the
    cleanup of leftover command processes)."""

    def __init__(self, workdir: Path, lines_path: Path) -> None:
        super().__init__(workdir)
        self.lines_path = lines_path

    def http_status(self, name: str, path: str) -> int:
        """The HTTP status of GET ``path`` on the daemon's endpoint (its config's ``http``;
        0: nothing answered), asked from where it runs (inside the namespace for a daemon
        there)."""
        address = tomllib.loads(self.config_path(name).read_text())["scheduler"]["http"]
        command = [sys.executable, "-c", _PROBE, f"http://{address}{path}"]
        wrap = self[name].wrap
        if wrap is not None:
            command = wrap(command)
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=15)
        try:
            return int(result.stdout.strip())
        except ValueError:
            return 0

    def wait_http(self, name: str, path: str, status: int, timeout: float) -> float:
        """Wait until GET ``path`` answers ``status``; return when (``time.time()``)."""

        def answered() -> float | None:
            return time.time() if self.http_status(name, path) == status else None

        return self.wait_until(f"{name}: {path} to answer {status}", answered, timeout, 0.2)

    def lines(self) -> list[Line]:
        return read_lines(self.lines_path)

    def leftovers(self) -> list[int]:
        """The command processes (programs and grandchildren) that still run."""
        pids = sorted({line.pid for line in self.lines()})
        return [pid for pid in pids if process_alive(pid) and _is_worker(pid, self.lines_path)]

    def close(self) -> None:
        """Kill and reap every daemon still running, then every command process left."""
        super().close()
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
