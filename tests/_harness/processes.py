"""The child processes of one test: started one way, watched, stopped or killed one way.

Every child is started from the repository root (unless told otherwise) with its stdout and
stderr appended to ``<name>.log`` in the test's directory; a name started again after its
process ended appends to the same log. Each child gets ``PR_SET_PDEATHSIG``: a pytest killed
outright leaves nothing running (``ip netns exec`` and a preloaded libfaketime keep the
setting: neither is set-user-ID). The signal comes when the *thread* that started the child
ends: start children from the test's own thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from tests.helpers import REPO, poll_until

__all__ = ["Child", "Processes", "Wrap", "clean_env", "process_start"]

T = TypeVar("T")
#: A change to a command line: ``NetworkNamespace.command`` runs it inside the namespace.
Wrap = Callable[[list[str]], list[str]]
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Looked up here, in the parent: the child between fork and exec only calls it.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def clean_env() -> dict[str, str]:
    """This process's environment without REPLICRON_* settings (a daemon would take them
    over its config)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("REPLICRON_")}


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``, which tells it from a
    later process given the same pid; None when there is no such process or it is a zombie
    (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class Child:
    """One process of a test, and what the test knows of it."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    where: str  # how it was started, for messages: "namespace, faketime +30s"
    wrap: Wrap | None = None  # what its command line was passed through (see spawn)
    expected_dead: bool = False
    paused: bool = False
    ended_mono: float | None = None  # when it was first seen gone (monotonic)
    term_sent: float | None = None  # when it was sent SIGTERM (monotonic)
    stop_took: float | None = None  # seconds from SIGTERM to its exit

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        self._seen_ended()
        return False

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def log(self) -> str:
        """Everything it wrote so far, stdout and stderr."""
        if not self.log_file.closed:  # closed once the process was reaped: all on disk
            self.log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def lines(self, text: str) -> list[str]:
        """The lines of its log that contain ``text``."""
        return [line for line in self.log().splitlines() if text in line]

    def wait_log(self, text: str, timeout: float = 20.0, count: int = 1) -> list[str]:
        """Wait until ``count`` lines of its log contain ``text``; return them. Fails at once
        when the process exits unexpectedly."""
        return poll_until(
            f"{count} line(s) with {text!r} in the log of {self.name}",
            lambda: found if len(found := self.lines(text)) >= count else None,
            timeout,
            before_each=self.check_alive,
        )

    def check_alive(self) -> None:
        """Fail when the process exited although it should still be running."""
        if not self.expected_dead and not self.alive():
            raise AssertionError(
                f"{self.name} ({self.where}) exited early with {self.proc.returncode}; "
                f"its log:\n{self.tail()}"
            )

    def terminate(self) -> None:
        """SIGTERM (a paused process is resumed first, to handle it)."""
        self.expected_dead = True
        if self.paused:
            self.resume()
        self.term_sent = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)

    def reap(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for it to exit; kill it then (exit code -9)."""
        try:
            code = self.proc.wait(max(0.1, timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        if self.term_sent is not None and self.stop_took is None:
            self.stop_took = time.monotonic() - self.term_sent
        self._seen_ended()
        return code

    def stop(self, timeout: float = 20.0) -> tuple[int, float]:
        """SIGTERM and wait (see :meth:`reap`); its exit code and the seconds it took."""
        self.terminate()
        code = self.reap(timeout)
        assert self.stop_took is not None
        return code, self.stop_took

    def kill(self) -> None:
        """SIGKILL (which ends a stopped process too) and reap it."""
        self.expected_dead = True
        self.proc.kill()
        self.proc.wait(10)
        self._seen_ended()

    def wait_exit(self, timeout: float) -> int:
        """Wait for a process that is expected to end by itself; its exit code."""
        self.expected_dead = True
        code = self.proc.wait(timeout)
        self._seen_ended()
        return code

    def pause(self) -> None:
        """SIGSTOP: the whole process freezes (as in a long GC pause or a stalled VM)."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def _seen_ended(self) -> None:
        if self.ended_mono is None:
            self.ended_mono = time.monotonic()


class Processes:
    """The child processes of one test, with their logs in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: list[Child] = []  # every process started, in order
        self.current: dict[str, Child] = {}  # the latest process of each name

    def __getitem__(self, name: str) -> Child:
        return self.current[name]

    def spawn(
        self,
        name: str,
        command: Sequence[str],
        *,
        wrap: Wrap | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO,
        where: str = "direct",
    ) -> Child:
        """Start ``command`` as ``name``, passed through ``wrap`` (into a network namespace,
        say; a probe of the test's can go the same way); does not wait for it to be ready."""
        previous = self.current.get(name)
        assert previous is None or not previous.alive(), f"{name} is still running"
        command = list(command) if wrap is None else wrap(list(command))
        log_path = self.workdir / f"{name}.log"
        log_file = log_path.open("ab")
        try:
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            log_file.close()
            raise
        child = Child(name, proc, log_path, log_file, where, wrap)
        self.children.append(child)
        self.current[name] = child
        return child

    def name_of(self, pid: int) -> str:
        """The name of a process of this test by its pid."""
        for child in self.children:
            if child.pid == pid:
                return child.name
        raise KeyError(f"no process of this test has pid {pid}")

    def check_alive(self) -> None:
        """Fail at once when a process exited that should still be running."""
        for child in self.children:
            child.check_alive()

    def wait_until(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.05
    ) -> T:
        """Poll ``check`` until it returns something other than None/False; fail after
        ``timeout`` seconds or as soon as a process dies unexpectedly."""
        return poll_until(what, check, timeout, every, before_each=self.check_alive)

    def kill(self, name: str) -> None:
        """``kill -9`` the process and reap it."""
        self.current[name].kill()

    def pause(self, name: str) -> None:
        self.current[name].pause()

    def resume(self, name: str) -> None:
        self.current[name].resume()

    def wait_exit(self, name: str, timeout: float = 30.0) -> int:
        """Wait for a process expected to end by itself; return its exit code."""
        return self.current[name].wait_exit(timeout)

    def stop(self, names: Iterable[str] | None = None, timeout: float = 30.0) -> dict[str, int]:
        """SIGTERM the processes (by default every live one) at once and wait for them; one
        still running after ``timeout`` is killed (exit code -9). Returns the exit codes."""
        wanted = None if names is None else set(names)
        chosen = [
            child
            for child in self.current.values()
            if (wanted is None or child.name in wanted) and child.alive()
        ]
        for child in chosen:
            child.terminate()
        deadline = time.monotonic() + timeout
        return {child.name: child.reap(deadline - time.monotonic()) for child in chosen}

    def close(self) -> None:
        """Kill and reap every process still running; close the logs."""
        for child in self.children:
            if child.alive():
                child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(10)
            child.log_file.close()

    def logs(self, lines: int = 400) -> str:
        """The end of each name's log (all its processes), with how each one was started."""
        parts = []
        for name in dict.fromkeys(child.name for child in self.children):
            mine = [child for child in self.children if child.name == name]
            heading = "; ".join(f"pid {c.pid} ({c.where}, exit {c.proc.poll()})" for c in mine)
            parts.append(f"----- {name}: {heading} -----\n{mine[-1].tail(lines)}")
        return "\n".join(parts)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies."""
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
