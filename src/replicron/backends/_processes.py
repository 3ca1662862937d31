"""Whether the process that wrote a ledger row still runs on this host.

Each row records its claimant's pid and, on Linux, the pid's start time, so that the open row
of a process that died (SIGKILL, OOM) can be told from a run still going, also after the pid
was reused (a restarted container gets the same small pids again).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["Claimant", "process_alive", "process_start"]


class Claimant(NamedTuple):
    """Who writes a row: the replica, and its process (``pid_start`` where the system tells)."""

    replica: str
    pid: int
    pid_start: int | None


def _proc_stat(pid: int) -> tuple[bytes, int] | None:
    """(state, start time in clock ticks since boot) from Linux's /proc, else None."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        fields = data[data.rindex(b")") + 2 :].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (an opaque number), where the system tells; else None."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def process_alive(pid: int, start: int | None) -> bool:
    """Whether the process that wrote a row (``pid`` started at ``start``) still runs on this
    host. A zombie is dead; a live pid that started at another time is a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and belongs to another user
    stat = _proc_stat(pid)
    if stat is None:  # no /proc here, or the process just went: count it as alive
        return True
    state, started = stat
    if state in (b"Z", b"X"):
        return False
    return start is None or started == start
