"""The suite's working directory and its lock: one fault-injection session per machine.

The network namespace has fixed names and addresses, so two sessions at once would trample
each other. A session holds an exclusive ``flock`` on ``/tmp/replicron-faults/.lock`` from
start to end; the kernel drops it when the process dies, however it dies. Whatever a session
finds under the directory while holding the lock was left by a crashed session (a
``kill -9``'d pytest cannot tear down): its PostgreSQL and pgbouncers are stopped and its
files removed before anything new starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["BASE", "as_postgres", "chown_postgres", "free_port", "suite_directory"]

BASE = Path(tempfile.gettempdir()) / "replicron-faults"
_LOCK_WAIT_S = 120.0


def as_postgres(command: list[str]) -> list[str]:
    """``command`` run as the OS user postgres (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *command]


def chown_postgres(path: Path) -> None:
    shutil.chown(path, user="postgres", group="postgres")


@contextlib.contextmanager
def suite_directory(pg_ctl: Path) -> Iterator[Path]:
    """Take the suite lock, clear what crashed sessions left, and yield a fresh directory
    owned by postgres; remove it afterwards. ``pg_ctl`` stops stale clusters."""
    BASE.mkdir(mode=0o755, exist_ok=True)
    os.chmod(BASE, 0o755)  # postgres must traverse it
    with (BASE / ".lock").open("a") as lock:
        _lock(lock.fileno())
        for stale in sorted(BASE.glob("run-*")):
            _clear_stale(stale, pg_ctl)
        path = Path(tempfile.mkdtemp(prefix="run-", dir=BASE))
        path.chmod(0o755)
        chown_postgres(path)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _lock(fd: int) -> None:
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"another fault-injection session has held {BASE}/.lock for "
                    f"{_LOCK_WAIT_S:.0f} s; only one may run per machine"
                ) from None
            time.sleep(0.5)  # another session's whole run: nothing finer to wait on


def _clear_stale(path: Path, pg_ctl: Path) -> None:
    """Stop the cluster and pgbouncers a crashed session left in ``path``, then remove it."""
    data = path / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            as_postgres([str(pg_ctl), "-D", str(data), "stop", "-m", "immediate", "-w"]),
            capture_output=True,
            check=False,
            timeout=60,
        )
    for pidfile in path.glob("pgbouncer-*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"pgbouncer" in cmdline and str(path).encode() in cmdline:
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def free_port(preferred: int, addresses: Sequence[str] = ("127.0.0.1",)) -> int:
    """``preferred``, or the next port after it that is free on every one of ``addresses``
    (so that a service left running by someone else does not stop the suite)."""
    for port in range(preferred, preferred + 100):
        try:
            for address in addresses:
                with socket.socket() as probe:
                    # As servers do: a port whose old connections linger in TIME_WAIT is free.
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port in {preferred}..{preferred + 99}")
