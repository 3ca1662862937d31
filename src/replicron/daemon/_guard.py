"""The leader of a command's process group: ``python -I -S _guard.py DAEMON_PID PROGRAM ARGS``.

It starts the program and waits for it, and when the daemon dies (even by SIGKILL, which
the daemon cannot act on) the kernel tells it (``PR_SET_PDEATHSIG``) and it kills its whole
group: the program and whatever the program started in the group. Without it only the
daemon's own child would learn of the death, and a shell's or wrapper's children would go on
running a job that another replica is about to start. Standard library only, no site
packages: it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1


def _fence(*_: object) -> None:
    os.killpg(0, signal.SIGKILL)  # the guard's group: the program, its children, the guard


def main(argv: list[str]) -> None:
    daemon, program = int(argv[0]), argv[1:]
    signal.signal(signal.SIGUSR1, _fence)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() != daemon:  # the daemon died before the death signal was set
        _fence()
    # A timeout's SIGTERM to the group is for the program: the guard waits to report how the
    # program ended, and the SIGKILL after the grace ends it too.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        try:
            os.execvp(program[0], program)
        except OSError as exc:
            os.write(2, f"cannot run {program[0]!r}: {exc.strerror}\n".encode())
            os._exit(127)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):  # end the same way, so the daemon reports the program's signal
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main(sys.argv[1:])
