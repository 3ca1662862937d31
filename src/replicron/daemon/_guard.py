"""The leader of a command's process group: ``python -I -S _guard.py DAEMON_PID PROGRAM ARGS``.

It starts the program and waits for it, and when the daemon dies (even by SIGKILL, which
the daemon cannot act on) the kernel tells it (``PR_SET_PDEATHSIG``) and it kills its whole
group: the program and whatever the program started in the group. Without it only the
daemon's own child would learn of the death, and a shell's or wrapper's children would go on
running a job that another replica is about to start. Standard library only, no site
packages: it costs a Python start, about 25 ms of CPU, per run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
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
    if _child:
        os.kill(_child, signal.SIGKILL)  # even if it moved to a process group of its own
    os.killpg(0, signal.SIGKILL)  # the guard's group: the program, its children, the guard


def _set_all(signums: Iterable[int], handler: signal.Handlers) -> None:
    for signum in signums:
        with contextlib.suppress(OSError, ValueError):  # those the system keeps to itself
            signal.signal(signum, handler)


def main(argv: list[str]) -> None:
    global _daemon, _child
    daemon, program = int(argv[0]), argv[1:]
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


if __name__ == "__main__":
    main(sys.argv[1:])
