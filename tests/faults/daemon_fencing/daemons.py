"""The daemons of the fencing test: real ``python -m replicron run CONFIG`` processes, each on
a TOML config of its own, started directly or inside the suite's network namespace, and the
lines their command jobs write (see ``worker.py``).

Every daemon's stderr (its log, which also carries its commands' output) goes to
``<name>.log`` in the test's directory. :meth:`Daemons.close` kills every daemon still running
and then every command process that a line names and that is still alive: a daemon killed
outright takes its command with it (``PR_SET_PDEATHSIG``), but not the command's own child.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from tests.faults.netns import NetworkNamespace
from tests.helpers import poll_until

__all__ = [
    "WORKER",
    "DaemonProcess",
    "Daemons",
    "Line",
    "config_text",
    "process_alive",
    "read_lines",
]

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).resolve().parent / "worker.py"
T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_prctl = ctypes.CDLL(None, use_errno=True).prctl

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


# ---- configs ---------------------------------------------------------------------------


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's string escapes are TOML's basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def config_text(scheduler: Mapping[str, object], jobs: Sequence[Mapping[str, object]]) -> str:
    """A daemon config: the ``[scheduler]`` table and one ``[[job]]`` per job."""
    lines = ["[scheduler]", *(f"{key} = {_toml(value)}" for key, value in scheduler.items())]
    for job in jobs:
        lines += ["", "[[job]]", *(f"{key} = {_toml(value)}" for key, value in job.items())]
    return "\n".join(lines) + "\n"


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
                    str(record["role"]), str(record["replica"]), str(record["run_id"]),
                    int(record["pid"]), int(record["pgid"]), float(record["wall"]),
                    float(record["mono"]),
                )
            )  # fmt: skip
    return sorted(found, key=lambda line: line.wall)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _is_worker(pid: int, lines_path: Path) -> bool:
    """Whether ``pid`` is still one of this test's command processes (not a reused pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(WORKER).encode() in argv and str(lines_path).encode() in argv


# ---- the daemons -----------------------------------------------------------------------


@dataclass
class DaemonProcess:
    name: str
    proc: subprocess.Popen[bytes]
    config_path: Path
    log_path: Path
    log_file: IO[bytes]
    http: tuple[str, int]
    in_namespace: bool
    expected_dead: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        self.log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"


class Daemons:
    """Starts and controls the daemons of one test; ``lines_path`` is where their command jobs
    write (for the cleanup of leftover command processes)."""

    def __init__(self, workdir: Path, netns: NetworkNamespace, lines_path: Path) -> None:
        self.workdir, self.netns, self.lines_path = workdir, netns, lines_path
        self.started: dict[str, DaemonProcess] = {}

    def start(
        self, name: str, config: str, *, http: tuple[str, int], in_namespace: bool = False
    ) -> DaemonProcess:
        """Write ``config`` to ``<name>.toml`` and start ``python -m replicron run`` on it,
        inside the namespace if asked; does not wait for it (see :meth:`wait_ready`)."""
        assert name not in self.started, f"daemon {name} was started already"
        config_path = self.workdir / f"{name}.toml"
        config_path.write_text(config)
        log_path = self.workdir / f"{name}.log"
        command = [sys.executable, "-m", "replicron", "run", str(config_path)]
        if in_namespace:
            command = self.netns.command(command)
        log_file = log_path.open("ab")
        try:
            proc = subprocess.Popen(
                command,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            log_file.close()
            raise
        daemon = DaemonProcess(name, proc, config_path, log_path, log_file, http, in_namespace)
        self.started[name] = daemon
        return daemon

    # ---- watching ------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Fail at once when a daemon exited that should still be running."""
        for daemon in self.started.values():
            if not daemon.expected_dead and not daemon.alive():
                raise AssertionError(
                    f"daemon {daemon.name} exited with {daemon.proc.returncode}; its log:\n"
                    f"{_tail(daemon.log(), 60)}"
                )

    def wait_until(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.05
    ) -> T:
        """Poll ``check`` until it returns something other than None/False; fail after
        ``timeout`` seconds, or at once when a daemon dies."""
        return poll_until(what, check, timeout, every, before_each=self.check_alive)

    def http_status(self, name: str, path: str) -> int:
        """The HTTP status of GET ``path`` on the daemon's endpoint (0: nothing answered),
        asked from where it listens (inside the namespace for a daemon there)."""
        daemon = self.started[name]
        host, port = daemon.http
        command = [sys.executable, "-c", _PROBE, f"http://{host}:{port}{path}"]
        if daemon.in_namespace:
            command = self.netns.command(command)
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

    # ---- stopping ------------------------------------------------------------------------

    def stop(self, names: Sequence[str], timeout: float = 20.0) -> dict[str, int]:
        """SIGTERM the daemons at once and wait for them; one still running after ``timeout``
        is killed (exit code -9). Returns the exit codes."""
        chosen = [self.started[name] for name in names if self.started[name].alive()]
        for daemon in chosen:
            daemon.expected_dead = True
            daemon.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = {}
        for daemon in chosen:
            try:
                codes[daemon.name] = daemon.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                daemon.proc.kill()
                codes[daemon.name] = daemon.proc.wait(10)
        return codes

    def leftovers(self) -> list[int]:
        """The command processes (programs and grandchildren) that still run."""
        pids = sorted({line.pid for line in self.lines()})
        return [pid for pid in pids if process_alive(pid) and _is_worker(pid, self.lines_path)]

    def close(self) -> None:
        """Kill and reap every daemon still running, then every command process left."""
        for daemon in self.started.values():
            if daemon.alive():
                daemon.expected_dead = True
                daemon.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(10)
        for pid in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for daemon in self.started.values():
            daemon.log_file.close()

    def logs(self) -> str:
        parts = []
        for daemon in self.started.values():
            where = "in the namespace" if daemon.in_namespace else "direct"
            parts.append(
                f"----- daemon {daemon.name} (pid {daemon.proc.pid}, {where}, exit "
                f"{daemon.proc.poll()}) -----\n{_tail(daemon.log(), 300)}"
            )
        return "\n".join(parts)

    @contextlib.contextmanager
    def logs_on_failure(self) -> Iterator[None]:
        """Print every daemon's log (captured, shown with the failure) if the block fails."""
        try:
            yield
        except BaseException:
            print(self.logs())
            raise


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so that a pytest
    killed outright leaves no daemon running (``ip netns exec`` keeps the setting). The signal
    comes when the *thread* that started the child ends: start daemons from the test's own
    thread."""
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])
