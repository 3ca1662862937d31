"""The leader of a command's process group:
``python -I -S _guard.py DAEMON_PID LEASE_FD PROGRAM ARGS``.

It starts the program and waits for it, and when the daemon dies (even by SIGKILL, which
the daemon cannot act on) the kernel tells it (``PR_SET_PDEATHSIG``) and it kills its whole
group: the program and whatever the program started in the group. Without it only the
daemon's own child would learn of the death, and a shell's or wrapper's children would go on
running a job that another replica is about to start. Standard library only, no site
packages: it costs a Python start, about 25 ms of CPU, per run.

``LEASE_FD`` (``-`` for none) is a pipe on which the daemon writes, a line each time it
changes, when the run's lease ends (``time.monotonic()``, the host's clock in every
process). Past it, unless a later line moved it, the guard kills the group: a daemon frozen
(SIGSTOP, a stalled VM) cannot renew the lease nor stop the run, and once the lease has run
out another replica may start the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import sys
import time
from collections.abc import Iterable

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
#: Signals that the kernel or the daemon uses on the guard; all others sent to the group
#: (a timeout's SIGTERM, a script's ``kill -HUP 0``) are for the program alone.
_OWN = (signal.SIGKILL, signal.SIGSTOP, signal.SIGUSR1, signal.SIGCHLD)
_daemon = 0
_child = 0


def _fence(*_: object) -> None:
    if _daemon and os.getppid() == _daemon:
        return  # a SIGUSR1 the program sent to its group, not the kernel's word of the death
    _kill_all()


def _kill_all() -> None:
    if _child:
        os.kill(_child, signal.SIGKILL)  # even if it moved to a process group of its own
    os.killpg(0, signal.SIGKILL)  # the guard's group: the program, its children, the guard


def _set_all(signums: Iterable[int], handler: signal.Handlers) -> None:
    for signum in signums:
        with contextlib.suppress(OSError, ValueError):  # those the system keeps to itself
            signal.signal(signum, handler)


def main(argv: list[str]) -> None:
    global _daemon, _child
    daemon, lease, program = int(argv[0]), argv[1], argv[2:]
    signal.signal(signal.SIGUSR1, _fence)
    linux = sys.platform.startswith("linux")
    libc = ctypes.CDLL(None, use_errno=True) if linux else None
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() != daemon:  # the daemon died before the death signal was set
        _fence()
    _daemon = daemon
    passed = [s for s in signal.valid_signals() if s not in _OWN]
    _set_all(passed, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        # Default handling for all, SIGPIPE and SIGXFSZ too, which Python ignores (an exec
        # keeps what is ignored): `producer | head -1` must end as it does under cron.
        _set_all([*passed, signal.SIGUSR1], signal.SIG_DFL)
        try:
            os.execvp(program[0], program)
        except OSError as exc:
            os.write(2, f"cannot run {program[0]!r}: {exc.strerror}\n".encode())
            os._exit(127)
    _child = child
    if lease != "-":
        _wait_leased(child, int(lease))
    _, status = os.waitpid(child, 0)
    _child = 0
    if os.WIFSIGNALED(status):  # end the same way, so the daemon reports the program's signal
        signum = os.WTERMSIG(status)
        if libc is not None:
            libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program's core dump, not the guard's
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


def _wait_leased(child: int, lease: int) -> None:
    """Until the program exits, or the lease's end passes (then the group is killed)."""
    exited = os.pidfd_open(child)
    watched = [exited, lease]
    ends = math.inf
    pending = b""
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            _kill_all()
        ready, _, _ = select.select(watched, [], [], None if left == math.inf else left)
        if exited in ready:
            return
        if lease in ready:
            data = os.read(lease, 4096)
            if not data:  # the daemon is done with the run: the last end stands
                watched.remove(lease)
                continue
            *lines, pending = (pending + data).split(b"\n")
            if lines:
                ends = float(lines[-1] or "inf")


if __name__ == "__main__":
    main(sys.argv[1:])
