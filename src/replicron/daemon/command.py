"""Command jobs: a program run per tick in a process group of its own, its output logged line
by line, its exit status the run's outcome, and the whole group killed when the run must end.

When the run must end decides how the group ends:

- past the job's ``timeout``: SIGTERM, then SIGKILL after ``kill_grace``; ``timed_out``;
- the daemon stopping: the engine's stop has one deadline (``stop_timeout`` from its start;
  now if hurried by a second signal), told to the run (``RunContext.stop_deadline``): SIGTERM
  ``kill_grace`` before it (halfway there if the stop gives less), SIGKILL at it;
  ``abandoned``, saying which signals it got and how it ended, whatever its exit status;
- its lock or lease lost: SIGKILL at once. A lost lease fires ``heartbeat_interval`` before
  any other replica may take the job over, and SIGKILL needs no cooperation from the
  program: this is what fences a command.

However it ends, the run is recorded (and its lock released) only once its process group is
gone: whatever the program left in it is killed when it exits.

The program leads its group itself. One reaper process per daemon (``_reaper.py``, started
with the first run) is told of each group and of each new end of its run's lease: it kills
every group when the daemon dies, even by SIGKILL, and a group whose lease has ended when the
daemon is frozen (SIGSTOP, a stalled VM) and can neither renew the lease nor kill the group.
A process that leaves the group (``setsid``, a daemon) is out of reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import time
from collections import deque
from collections.abc import Coroutine, Mapping, Sequence
from datetime import UTC, timedelta
from typing import Any

from replicron.context import CancelReason, RunContext, current_run

from ._reaper import Reaper

__all__ = ["CommandFailed", "CommandTask"]

logger = logging.getLogger("replicron.command")

#: Lines of the program's stderr kept for the error text of a failed run.
ERROR_LINES = 10
#: Kills the groups when the daemon cannot (see _reaper): one per daemon, started with the
#: first run.
_REAPER = Reaper()
#: Every signal a process can handle: reset for a command (SIGKILL and SIGSTOP cannot be).
_CATCHABLE = tuple(sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))
#: What ``subprocess`` sets back to the default itself (``restore_signals``).
_RESTORED = {signal.SIGPIPE, signal.SIGXFSZ}
_CHUNK = 65536
_SHUT_DOWN = "the scheduler shut down before the run returned"
#: Why a run is abandoned whose lease ended while its daemon could not renew it (frozen).
_FENCED = (
    "its lease ended while the daemon could not renew it (frozen, say): the reaper killed "
    "its process group, since another replica may take the job over"
)
#: Seconds a killed group has to be gone before the run is recorded all the same (a process
#: in uninterruptible sleep, say), named in a warning.
_GONE_WITHIN = 10.0
_MAX_LINE = 8192  # longer lines are logged in pieces


def _signals_changed() -> bool:
    """Whether this thread blocks a signal, or the process ignores one that ``subprocess``
    does not restore by itself: only then must the command's process reset them (a function
    to run before exec costs a full fork instead of a vfork, about 1.5 ms of CPU a run)."""
    ignored = signal.SIG_IGN
    return any(
        signal.getsignal(signum) is ignored for signum in _CATCHABLE if signum not in _RESTORED
    ) or bool(signal.pthread_sigmask(signal.SIG_BLOCK, ()))


def _default_signal_handling() -> None:
    """In the command's process, before it executes the program: every signal back to its
    default handling, none blocked. An exec keeps what is ignored and the signal mask, and
    the daemon may have inherited both (started by a script with ``&``, SIGINT and SIGQUIT
    arrive ignored); ``subprocess`` restores only SIGPIPE and SIGXFSZ."""
    for signum in _CATCHABLE:
        with contextlib.suppress(OSError, ValueError):  # those the C library keeps for itself
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class CommandFailed(Exception):
    """The program exited with a non-zero status or was killed by a signal."""


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The streams' protocol, which also tells when the process exited: ``Process.wait()``
    waits for its pipes to close as well, which a background child holds open."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_CHUNK, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class CommandTask:
    """The task of a command job: ``await task()`` inside a run starts the program and ends
    when it has exited (raising :class:`CommandFailed` on a non-zero status)."""

    def __init__(
        self,
        job: str,
        argv: Sequence[str],
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        kill_grace: timedelta = timedelta(seconds=10),
    ) -> None:
        self.job = job
        self.argv = ("/bin/sh", "-c", argv[0]) if shell else tuple(argv)
        self.env = dict(env or {})
        self.cwd = cwd
        self.kill_grace = kill_grace.total_seconds()
        # What the cluster registry fingerprints: two replicas running different programs
        # under one job name show up as drift.
        self.__qualname__ = f"command {shlex.join(self.argv)} in {cwd or '.'}"
        self.__module__ = "replicron.daemon"

    def __repr__(self) -> str:
        return f"CommandTask({self.job!r}, {list(self.argv)!r})"

    async def __call__(self) -> None:
        run = current_run()
        scheduled = run.scheduled_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        env = {
            **os.environ,
            **self.env,
            "REPLICRON_JOB": self.job,
            "REPLICRON_SCHEDULED_AT": scheduled,
            "REPLICRON_RUN_ID": "" if run.run_id is None else str(run.run_id),
            "REPLICRON_REPLICA_ID": run.replica_id,
        }
        label = f"{self.job}[{run.run_id if run.run_id is not None else scheduled}]"
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(loop),
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group (and session): killed as one
                preexec_fn=_default_signal_handling if _signals_changed() else None,
            )
        except OSError as exc:
            if exc.filename != self.argv[0]:
                raise  # not the program's: its working directory, say
            # As a shell says it, and the same status.
            errors: deque[str] = deque(maxlen=ERROR_LINES)
            extra: dict[str, object] = {"event": "stderr", "job": self.job, "run_id": run.run_id}
            said = f"cannot run {self.argv[0]!r}: {exc.strerror}".encode()
            _log_line(said, extra, label, "stderr", errors)
            raise CommandFailed(_describe(127, errors)) from None
        process = asyncio.subprocess.Process(transport, protocol, loop)
        exited = protocol.exited
        group = process.pid
        errors = deque(maxlen=ERROR_LINES)
        assert process.stdout is not None
        assert process.stderr is not None
        pumps = [
            asyncio.ensure_future(
                _pump(process.stdout, self.job, label, "stdout", None, run.run_id)
            ),
            asyncio.ensure_future(
                _pump(process.stderr, self.job, label, "stderr", errors, run.run_id)
            ),
        ]
        stop = _Stop(self, group, run, exited)
        run._on_stop = stop  # the scheduler says when it stops
        if run.stop_deadline is not None:
            stop(run.stop_deadline)
        try:
            # The reaper kills the group if this daemon dies, or is frozen past its lease.
            _REAPER.add(group, None if run.lease_deadline is None else lambda: run.lease_deadline)
            await asyncio.shield(exited)
        except asyncio.CancelledError:
            if stop.killed:  # at the stop's deadline, SIGKILL went already
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(exited)
            else:
                await self._end(exited, group, run)
            raise
        finally:
            stop.close()
            # Whatever the program left behind in its group goes with the run: a run is over
            # when it is recorded, and nothing of it may overlap the next one. So it is
            # recorded (and its lock released) once the group is gone, even if cut off again.
            _kill_group(group, signal.SIGKILL)
            lapsed = _REAPER.lapsed(group)
            await _uncancelled(_clean_up(group, self.job, pumps, transport))
            status = -1 if process.returncode is None else process.returncode
            if stop.sent:  # cut off by the stop: recorded abandoned, saying how it ended
                how = f"{_SHUT_DOWN}: {stop.sent}; {_describe(status, errors)}"
                run.cancel(CancelReason.SHUTDOWN, how)
            elif lapsed and status == -signal.SIGKILL and run.cancel_reason is None:
                run.cancel(CancelReason.LOCK_LOST, _FENCED)
        if status != 0 and not stop.sent:
            raise CommandFailed(_describe(status, errors))

    async def _end(self, exited: asyncio.Future[None], group: int, run: RunContext) -> None:
        """The run was cut off: end the group the way the reason asks for."""
        if run.cancel_reason is CancelReason.TIMEOUT and self.kill_grace > 0:
            _kill_group(group, signal.SIGTERM)
            logger.warning(
                "%s: past its timeout: sent SIGTERM to its process group; SIGKILL in %g s",
                self.job,
                self.kill_grace,
                extra={"job": self.job, "event": "command_term"},
            )
            try:
                await asyncio.wait_for(asyncio.shield(exited), self.kill_grace)
                return
            except TimeoutError:
                logger.warning(
                    "%s: still running %g s after SIGTERM: SIGKILL",
                    self.job,
                    self.kill_grace,
                    extra={"job": self.job, "event": "command_kill"},
                )
            except asyncio.CancelledError:
                pass  # cut off again meanwhile (its lease ran out): no more waiting
        else:
            why = run.cancel_detail or "the run was cancelled"
            logger.warning(
                "%s: %s: killing its process group",
                self.job,
                why,
                extra={"job": self.job, "event": "command_kill"},
            )
        _kill_group(group, signal.SIGKILL)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(exited)


def _kill_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` is still there (a zombie counts: see _only_zombies)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _only_zombies(group: int) -> bool:
    """Whether /proc shows the group's processes all dead and waiting to be reaped (by a
    parent that may never do it: a daemon that is PID 1 in its container)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != b"Z":
            return False
    return True


async def _gone(group: int, job: str) -> None:
    """Return once the killed group is gone: the run's outcome, and so its lock, waits for
    that."""
    waited, step = 0.0, 0.001
    while _group_alive(group) and not (waited > 0.05 and _only_zombies(group)):
        if waited > _GONE_WITHIN:
            logger.warning(
                "%s: process group %d still there %g s after SIGKILL: recorded all the same",
                job,
                group,
                _GONE_WITHIN,
                extra={"job": job, "event": "group_left"},
            )
            return
        await asyncio.sleep(step)
        waited += step
        step = min(2 * step, 0.1)


class _Stop:
    """The scheduler's stop, for one run: its group gets SIGTERM ``kill_grace`` before the
    stop's deadline, or halfway there if the stop gives less than twice that (so a command
    always has time to finish on its own first), SIGKILL at the deadline. Told the deadline
    again if a second signal hurries the stop."""

    def __init__(
        self, task: CommandTask, group: int, run: RunContext, exited: asyncio.Future[None]
    ) -> None:
        self.job, self.grace, self.group, self.run, self.exited = (
            task.job,
            task.kill_grace,
            group,
            run,
            exited,
        )
        self.timers: list[asyncio.TimerHandle] = []
        self.sent = ""  # the signals sent, in words
        self.killed = False

    def __call__(self, by: float) -> None:
        for timer in self.timers:
            timer.cancel()
        now, later = time.monotonic(), self.exited.get_loop().call_later
        self.timers = []
        if not self.sent and self.grace > 0:  # (first: both may be due now)
            grace = min(self.grace, max(0.0, by - now) / 2)
            self.timers.append(later(max(0.0, by - grace - now), self._term, by))
        self.timers.append(later(max(0.0, by - now), self._kill))

    def _term(self, by: float) -> None:
        if self.exited.done():
            return
        self.run.cancel(CancelReason.SHUTDOWN, _SHUT_DOWN)
        self.sent = "SIGTERM at stop"
        _kill_group(self.group, signal.SIGTERM)
        logger.warning(
            "%s: the scheduler is stopping: sent SIGTERM to its process group; SIGKILL in %.3g s",
            self.job,
            max(0.0, by - time.monotonic()),
            extra={"job": self.job, "event": "command_term"},
        )

    def _kill(self) -> None:
        if self.exited.done():
            return
        self.run.cancel(CancelReason.SHUTDOWN, _SHUT_DOWN)
        self.sent = f"{self.sent}, then " if self.sent else ""
        self.sent += "SIGKILL at the stop's deadline"
        self.killed = True
        logger.warning(
            "%s: still running when the stop's time ran out: killing its process group",
            self.job,
            extra={"job": self.job, "event": "command_kill"},
        )
        _kill_group(self.group, signal.SIGKILL)

    def close(self) -> None:
        self.run._on_stop = None
        for timer in self.timers:
            timer.cancel()


async def _uncancelled(step: Coroutine[Any, Any, None]) -> None:
    """Await ``step`` to its end even if cut off meanwhile (and then raise CancelledError)."""
    future = asyncio.ensure_future(step)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def _clean_up(
    group: int, job: str, pumps: Sequence[asyncio.Future[None]], transport: asyncio.BaseTransport
) -> None:
    await _gone(group, job)
    _REAPER.remove(group)
    await _drain(pumps)
    transport.close()  # its pipes too, held open by a process that left the group


async def _drain(pumps: Sequence[asyncio.Future[None]]) -> None:
    """Let the output readers finish the last lines (the group is gone, so the pipes close
    unless a process that left the group holds them)."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait(pumps, timeout=5.0)
    left = [pump for pump in pumps if not pump.done()]
    for pump in left:
        pump.cancel()
    if left:
        logger.warning(
            "output still held open 5 s after the run's process group ended (by a process "
            "that left the group?): stopped reading it",
            extra={"event": "pipe_held"},
        )
    await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(
    stream: asyncio.StreamReader,
    job: str,
    label: str,
    name: str,
    tail: deque[str] | None,
    run_id: int | None,
) -> None:
    extra: dict[str, object] = {"event": name, "job": job, "run_id": run_id}
    pending = b""
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _log_line(line, extra, label, name, tail)
        while len(pending) > _MAX_LINE:
            _log_line(pending[:_MAX_LINE], extra, label, name, tail)
            pending = pending[_MAX_LINE:]
    if pending:
        _log_line(pending, extra, label, name, tail)


def _log_line(
    raw: bytes, extra: dict[str, object], label: str, name: str, tail: deque[str] | None
) -> None:
    line = raw.rstrip(b"\r").decode("utf-8", "replace")
    if not line.isprintable():  # no terminal escapes or carriage returns into the log
        line = "".join(c if c == "\t" or c.isprintable() else f"\\x{ord(c):02x}" for c in line)
    if tail is not None:
        tail.append(line)
    logger.info("%s %s| %s", label, name, line, extra=extra)


def _describe(status: int, errors: deque[str]) -> str:
    if status < 0:
        try:
            what = f"killed by {signal.Signals(-status).name}"
        except ValueError:
            what = f"killed by signal {-status}"
    else:
        what = f"exit status {status}"
    if not errors:
        return what
    return f"{what}; stderr: " + " / ".join(line for line in errors if line.strip())[-2000:]
