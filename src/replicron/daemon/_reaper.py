"""The reaper: one small process per daemon that ends the command jobs' process groups when
the daemon cannot.

The daemon starts it once, with the first command run (``python -I -S _reaper.py
DAEMON_PID``: standard library only, no site packages), and tells it over a pipe (its stdin)
each process group it starts, each new end of that run's lease, and each group that is gone:

- ``+ GROUP END``: a new group, its lease ending at ``END`` (``time.monotonic()``, the
  host's clock in every process; ``inf`` without a lease);
- ``= GROUP END``: a heartbeat renewed the lease;
- ``- GROUP``: the group is gone, forget it.

It kills (SIGKILL) every group it knows when the daemon dies, even by SIGKILL, which the
daemon cannot act on (the pipe's end closes, and on Linux the kernel tells it with
``PR_SET_PDEATHSIG``), and a group whose lease end has passed with no later end told: a daemon
frozen (SIGSTOP, a stalled VM) can neither renew a lease nor stop the run, and past the
lease's end another replica may start the job. A process that leaves its group (``setsid``,
a daemon) is out of reach, as for any other signal to the group.

Unlike a guard process leading each group, this costs one Python start per daemon, not one
per run (see docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__ = ["Reaper"]

_PR_SET_PDEATHSIG = 1
#: Seconds between looks at the leases of the runs under way (a heartbeat renews them far
#: less often).
LEASE_FEED = 0.2
_COMMAND = (sys.executable, "-I", "-S", str(Path(__file__)))
LeaseEnd = Callable[[], "float | None"]


class Reaper:
    """The daemon's side: starts the reaper process when first needed (again if it died) and
    tells it of the groups. Used from the event loop's thread."""

    def __init__(self, command: tuple[str, ...] = _COMMAND) -> None:
        self._command = command
        self._process: subprocess.Popen[bytes] | None = None
        self._pid = 0  # the process that started it (a forked child starts its own)
        self._pending = b""  # what the pipe did not take yet
        self._groups: dict[int, LeaseEnd | None] = {}
        self._told: dict[int, float] = {}  # the lease end last written, per leased group
        self._lapsed: set[int] = set()  # groups whose lease end passed before a later was told
        self._feeding: object = None  # the event loop the lease feed runs on

    @property
    def pid(self) -> int | None:
        """The reaper process's pid, once started."""
        return None if self._process is None else self._process.pid

    def add(self, group: int, lease_end: LeaseEnd | None) -> None:
        """Watch ``group``; ``lease_end`` tells when its run's lease ends (``None``: no lease,
        or it was lost: the daemon kills the group itself then)."""
        self._groups[group] = lease_end
        end = None if lease_end is None else lease_end()
        if end is not None:
            self._told[group] = end
        self._send(f"+ {group} {math.inf if end is None else end!r}\n")
        loop = _loop()
        if self._feeding is not loop:  # (a new loop: the last one's feed ended with it)
            self._feeding = loop
            loop.call_later(LEASE_FEED, self._feed)

    def lapsed(self, group: int) -> bool:
        """Whether ``group``'s lease ended before the reaper was told of a later end (the
        daemon frozen, say): then the reaper has killed the group, or is about to."""
        told = self._told.get(group)
        return group in self._lapsed or (told is not None and time.monotonic() >= told)

    def remove(self, group: int) -> None:
        """``group`` is gone: the reaper forgets it (its number may be reused)."""
        self._groups.pop(group, None)
        self._told.pop(group, None)
        self._lapsed.discard(group)
        if self._process is not None:  # (none: it could not be started; nothing to forget)
            with contextlib.suppress(OSError):
                self._send(f"- {group}\n")

    def close(self, timeout: float = 5.0) -> None:
        """End the reaper (it kills the groups it still knows first) and wait for it."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _feed(self) -> None:
        """While groups are under way: tell the reaper the leases that heartbeats renewed
        since the last look, and start a new one if it died."""
        try:
            if self._process is not None and self._process.poll() is not None:
                self._restart()
            lines, now = [], time.monotonic()
            for group, lease_end in self._groups.items():
                end = None if lease_end is None else lease_end()
                told = self._told.get(group)
                if end is not None and end != told:
                    if told is not None and now >= told:  # renewed too late: it was killed
                        self._lapsed.add(group)
                    self._told[group] = end
                    lines.append(f"= {group} {end!r}\n")
            if lines:
                self._send("".join(lines))
        finally:
            if self._groups:
                _loop().call_later(LEASE_FEED, self._feed)
            else:
                self._feeding = None

    def _send(self, text: str) -> None:
        process = self._running()
        self._pending += text.encode()
        assert process.stdin is not None
        try:
            written = os.write(process.stdin.fileno(), self._pending)
        except BlockingIOError:  # the reaper is behind (stopped?): the next write sends it
            return
        except BrokenPipeError:
            self._restart()
            return
        self._pending = self._pending[written:]

    def _restart(self) -> None:
        """The reaper died (killed by hand?): a new one is told of every group."""
        process, self._process = self._process, None
        if process is not None:
            process.wait()
        self._pending = b""
        self._send("".join(f"+ {g} {self._told.get(g, math.inf)!r}\n" for g in self._groups))

    def _running(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is None or self._pid != os.getpid():
            process = self._process = subprocess.Popen(
                [*self._command, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is not for it
            )
            self._pid = os.getpid()
            assert process.stdin is not None
            os.set_blocking(process.stdin.fileno(), False)
        return process


def _loop() -> asyncio.AbstractEventLoop:
    import asyncio  # the daemon's side only: the reaper process does without it

    return asyncio.get_running_loop()


# ---- the reaper process ------------------------------------------------------------------

_groups: dict[int, float] = {}  # group -> when its lease ends (inf: no lease)
_pending = b""  # the start of a line not read whole yet


def _kill(group: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(group, signal.SIGKILL)  # its leader, even if it moved to a group of its own


def _told(data: bytes) -> None:
    global _pending
    *lines, _pending = (_pending + data).split(b"\n")
    for line in lines:
        parts = line.split()
        with contextlib.suppress(ValueError, IndexError):
            group = int(parts[1])
            if parts[0] == b"-":
                _groups.pop(group, None)
            elif parts[0] in (b"+", b"="):
                _groups[group] = float(parts[2])


def main(argv: list[str]) -> None:
    daemon, pipe = int(argv[0]), sys.stdin.fileno()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)  # only the daemon's end ends it
    # The kernel's word of the daemon's death wakes the loop below, which looks at it in turn.
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    while os.getppid() == daemon:  # (a SIGUSR1 from elsewhere, or its starting thread's end)
        now = time.monotonic()
        for group, end in list(_groups.items()):
            if end <= now:
                _kill(group)  # its lease ended and no heartbeat renewed it
                _groups[group] = math.inf  # still known: killed again if the daemon dies
        first = min(_groups.values(), default=math.inf)
        left = None if first == math.inf else first - now
        ready, _, _ = select.select([pipe, woken], [], [], left)
        if woken in ready:
            os.read(woken, 512)
        if pipe in ready:
            data = os.read(pipe, 65536)
            if not data:  # the daemon closed it, or died
                break
            _told(data)
    # The daemon is gone (or done): what it wrote before is read first, its last group too.
    os.set_blocking(pipe, False)
    with contextlib.suppress(OSError):
        while data := os.read(pipe, 65536):
            _told(data)
    for group in list(_groups):
        _kill(group)


if __name__ == "__main__":
    main(sys.argv[1:])
