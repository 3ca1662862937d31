"""The suite's working directory: one directory per fault-injection session, and no lock
between sessions.

Each session has its own directory under ``/tmp/replicron-faults``, its own ports and its own
network namespace and addresses (:mod:`tests.faults.netns`), so two sessions can run side by
side. A session holds an exclusive ``flock`` on its directory's ``.lock`` from start to end;
the kernel drops it when the process dies, however it dies. A directory whose lock another
session can take was left by a crashed session (a ``kill -9``'d pytest cannot tear down):
its PostgreSQL, pgbouncers and namespace are removed before anything new starts.
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
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.faults.netns import destroy_namespace

__all__ = [
    "BASE",
    "NAMESPACE_FILE",
    "as_postgres",
    "chown_postgres",
    "free_port",
    "suite_directory",
]

BASE = Path(tempfile.gettempdir()) / "replicron-faults"
#: The file in a session's directory naming its network namespace, for the session that
#: clears it after a crash.
NAMESPACE_FILE = "netns"


def as_postgres(command: list[str]) -> list[str]:
    """``command`` run as the OS user postgres (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *command]


def chown_postgres(path: Path) -> None:
    shutil.chown(path, user="postgres", group="postgres")


@contextlib.contextmanager
def suite_directory(pg_ctl: Path) -> Iterator[Path]:
    """Clear what crashed sessions left, and yield a fresh directory owned by postgres,
    locked for this session; remove it afterwards. ``pg_ctl`` stops stale clusters."""
    BASE.mkdir(mode=0o755, exist_ok=True)
    os.chmod(BASE, 0o755)  # postgres must traverse it
    for stale in sorted(BASE.glob("run-*")):
        _clear_if_abandoned(stale, pg_ctl)
    path = Path(tempfile.mkdtemp(prefix="run-", dir=BASE))
    with (path / ".lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # a new directory: nobody else holds it
        path.chmod(0o755)
        chown_postgres(path)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _clear_if_abandoned(path: Path, pg_ctl: Path) -> None:
    """Clear ``path`` if no live session holds its lock (or it never got one)."""
    try:
        lock = (path / ".lock").open("a")
    except OSError:  # removed meanwhile by its own session, or not a directory
        return
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live session's
        _clear_stale(path, pg_ctl)


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
    with contextlib.suppress(OSError):
        destroy_namespace((path / NAMESPACE_FILE).read_text().strip())
    shutil.rmtree(path, ignore_errors=True)


def free_port(addresses: Sequence[str] = ("127.0.0.1",)) -> int:
    """A port the kernel picks (from its ephemeral range, at random) that is free on every
    one of ``addresses``: two sessions side by side do not pick the same one."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind((addresses[0], 0))
            port = int(first.getsockname()[1])
        try:
            for address in addresses[1:]:
                with socket.socket() as probe:
                    probe.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {', '.join(addresses)} in 100 tries")
