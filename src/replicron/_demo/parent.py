"""``replicron demo``: several real replica processes share one backend; every tick runs once.

The parent starts ``--replicas`` processes (``python -m replicron._demo.replica --replica ...``, see
:mod:`replicron._demo.replica`), each running a :class:`~replicron.Scheduler` with the same two
jobs on the shared backend: the embedded backend in a temporary state directory, or PostgreSQL
under a namespace of its own (``--database-url``). Every replica reports each tick it saw
(ran it, or skipped it because another replica had it) as JSON lines; the parent groups the
reports by tick, prints one line per tick in tick order, stops the replicas after
``--seconds`` and prints a summary. Exit status 0 when no tick ran twice and none was missed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import IO, Any

from replicron._schedule.tz import UTC
from replicron.dsn import mask_dsn
from replicron.triggers import every

from .replica import DATABASE_URL_ENV, JOBS

__all__ = ["run_demo"]

READY_TIMEOUT = 60.0  # seconds for every replica to start its scheduler
TICK_GRACE = 3.0  # seconds after a tick's work should be done before it is printed incomplete
STOP_LEAD = 0.5  # replicas stop this long before the end of the window, between two ticks
EXIT_TIMEOUT = 15.0  # seconds a stopping replica gets before it is killed
_URL = re.compile(r"postgres(ql)?://", re.IGNORECASE)
_JOB_WIDTH = max(len(job.name) for job in JOBS)


class ReplicaFailedError(Exception):
    """A replica could not start; the message names it and quotes its log."""


@dataclass(frozen=True, slots=True)
class _Report:
    kind: str  # ran | skipped | missed | error
    replica: str
    run_id: int | None = None
    late_ms: float | None = None
    outcome: str | None = None
    why: str | None = None


@dataclass(slots=True)
class _Tick:
    job: str
    at: datetime
    due: float = math.inf  # epoch seconds after which it is printed whoever reported
    in_window: bool = False
    printed: bool = False
    reports: list[_Report] = field(default_factory=list)

    def of(self, kind: str) -> list[_Report]:
        return [r for r in self.reports if r.kind == kind]


@dataclass(slots=True, eq=False)
class _Replica:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    reader: threading.Thread
    ready_at: float | None = None
    ended: bool = False  # its stdout reached its end


class _Demo:
    def __init__(self, seconds: float, count: int, url: str | None, state_dir: Path) -> None:
        self.seconds, self.count, self.url, self.state_dir = seconds, count, url, state_dir
        self.namespace = f"demo-{secrets.token_hex(4)}/"
        self.log_dir = state_dir / "logs"
        self.replicas: dict[str, _Replica] = {}
        self.inbox: queue.SimpleQueue[tuple[str, bytes | None]] = queue.SimpleQueue()
        self.ticks: dict[tuple[str, datetime], _Tick] = {}
        self.window: list[_Tick] = []
        self.printed = 0  # window ticks printed so far
        self.problems: list[str] = []

    # ---- the run -----------------------------------------------------------------------

    def backend_text(self, where: bool = True) -> str:
        if self.url is None:
            state = f", state in {self.state_dir / 'state'}" if where else ""
            return f"embedded (SQLite + file locks){state}"
        return f"PostgreSQL {mask_dsn(self.url)}, namespace {self.namespace}"

    def run(self) -> int:
        jobs = ", ".join(f"{j.name} every {j.every_s} s (~{j.work_s * 1000:g} ms)" for j in JOBS)
        procs = "1 replica process" if self.count == 1 else f"{self.count} replica processes, each"
        _say(f"replicron demo: {procs} with the jobs {jobs}")
        _say(f"backend: {self.backend_text()}")
        self.log_dir.mkdir()
        for index in range(1, self.count + 1):
            self._spawn(f"replica-{index}")
        started = time.monotonic()
        self._wait_ready()
        start, end = self._plan_window()
        _say(
            f"all replicas up after {time.monotonic() - started:.1f} s; one line per tick "
            f"from {_clock(start)} for {self.seconds:g} s\n"
        )
        stop_at, give_up = end.timestamp() - STOP_LEAD, end.timestamp() + TICK_GRACE + 1.0
        while True:
            self._pump(0.05)
            self._print_ticks()
            now = time.time()
            if now >= give_up or (now >= stop_at and self.printed == len(self.window)):
                break
        self.terminate()
        self._pump(0.0)
        self._print_ticks(final=True)
        for replica in self.replicas.values():
            code = replica.proc.returncode
            if code != 0:
                self.problems.append(f"{replica.name} exited with status {code}")
        return self._summary()

    def _spawn(self, name: str) -> None:
        command = [sys.executable, "-m", "replicron._demo.replica", "--replica", name]
        env = None
        if self.url is None:
            command += ["--state-dir", str(self.state_dir / "state")]
        else:
            command += ["--namespace", self.namespace]
            env = {**os.environ, DATABASE_URL_ENV: self.url}
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the parent only; it stops them
            )
        assert proc.stdout is not None
        reader = threading.Thread(
            target=self._read, args=(name, proc.stdout), name=f"demo-read-{name}", daemon=True
        )
        self.replicas[name] = _Replica(name, proc, log_path, reader)
        reader.start()

    def _read(self, name: str, stream: IO[bytes]) -> None:
        try:
            for line in stream:
                self.inbox.put((name, line))
        finally:
            self.inbox.put((name, None))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while any(r.ready_at is None for r in self.replicas.values()):
            for replica in self.replicas.values():
                if replica.ended and replica.ready_at is None:
                    code = replica.proc.wait(EXIT_TIMEOUT)
                    raise ReplicaFailedError(
                        f"{replica.name} stopped before it was ready (exit status {code})"
                        + _last_line(replica.log_path)
                    )
            if time.monotonic() > deadline:
                late = [r.name for r in self.replicas.values() if r.ready_at is None]
                raise ReplicaFailedError(f"not ready after {READY_TIMEOUT:g} s: {', '.join(late)}")
            self._pump(0.1)

    def _plan_window(self) -> tuple[datetime, datetime]:
        """The ticks every replica sees: from the first whole second after the last replica
        came up, for ``seconds``."""
        last_ready = max(r.ready_at or 0.0 for r in self.replicas.values())
        start = datetime.fromtimestamp(math.floor(last_ready) + 1, UTC)
        end = start + timedelta(seconds=self.seconds)
        for job in JOBS:
            trigger = every(seconds=job.every_s)
            at = trigger.next_after(start - timedelta(microseconds=1))
            while at is not None and at < end:
                tick = self._tick(job.name, at)
                tick.in_window, tick.due = True, at.timestamp() + job.work_s + TICK_GRACE
                self.window.append(tick)
                at = trigger.next_after(at)
        order_of = {job.name: i for i, job in enumerate(JOBS)}
        self.window.sort(key=lambda t: (t.at, order_of[t.job]))
        return start, end

    def _tick(self, job: str, at: datetime) -> _Tick:
        key = (job, at)
        tick = self.ticks.get(key)
        if tick is None:
            tick = self.ticks[key] = _Tick(job, at)
        return tick

    # ---- reports -----------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        """Handle what the replicas said: wait up to ``timeout`` for a first line, then take
        everything already there."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
            while True:
                self._handle(*item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            return

    def _handle(self, name: str, line: bytes | None) -> None:
        replica = self.replicas[name]
        if line is None:
            replica.ended = True
            return
        try:
            message: dict[str, Any] = json.loads(line)
            kind = message["kind"]
            if kind == "ready":
                replica.ready_at = float(message["at"])
                return
            if kind not in ("ran", "skipped", "missed", "error"):
                return
            at = datetime.fromisoformat(message["tick"]).astimezone(UTC)
            report = _Report(
                kind,
                name,
                message.get("run_id"),
                message.get("late_ms"),
                message.get("outcome"),
                message.get("why"),
            )
            tick = self._tick(str(message["job"]), at)
        except (ValueError, KeyError, TypeError):
            return  # not one of ours: ignore
        tick.reports.append(report)
        if tick.printed:
            _say(f"{_clock(tick.at)}  {tick.job:<{_JOB_WIDTH}}  late report: {_one(report)}")

    def _print_ticks(self, final: bool = False) -> None:
        """Print window ticks in order, each once every live replica reported it (or once
        its grace is over)."""
        now = time.time()
        while self.printed < len(self.window):
            tick = self.window[self.printed]
            reported = {r.replica for r in tick.reports}
            waiting = [r for r in self.replicas.values() if not r.ended and r.name not in reported]
            if waiting and now < tick.due and not final:
                return
            _say(self._tick_line(tick))
            tick.printed = True
            self.printed += 1

    def _tick_line(self, tick: _Tick) -> str:
        ran, skipped = tick.of("ran"), tick.of("skipped")
        if len(ran) == 1:
            what = _one(ran[0])
        elif not ran:
            whys = sorted({f"{r.replica}: {r.why}" for r in tick.reports if r.kind != "skipped"})
            what = "NOT RUN" + (f" ({'; '.join(whys)})" if whys else "")
        else:
            runs = ", ".join(f"{r.replica} (run {r.run_id})" for r in sorted(ran, key=_by_replica))
            what = f"RAN {len(ran)} TIMES: {runs}"
        counts = f"ran={len(ran)} skipped={len(skipped)}"
        for kind in ("missed", "error"):
            if tick.of(kind):
                counts += f" {kind}={len(tick.of(kind))}"
        silent = sorted(set(self.replicas) - {r.replica for r in tick.reports})
        if silent:
            counts += f"  (no report from {', '.join(silent)})"
        return f"{_clock(tick.at)}  {tick.job:<{_JOB_WIDTH}}  {what:<38}  {counts}"

    def _summary(self) -> int:
        runs_by = dict.fromkeys(self.replicas, 0)
        for tick in self.window:
            for report in tick.of("ran"):
                runs_by[report.replica] = runs_by.get(report.replica, 0) + 1
        runs = sum(runs_by.values())
        doubled = [t for t in self.ticks.values() if len(t.of("ran")) > 1]
        for tick in doubled:
            if not tick.in_window:  # before every replica was up, or after the window
                _say(f"{self._tick_line(tick)}  (outside the window)")
        misses = sum(1 for t in self.window if not t.of("ran"))
        _say(
            f"\nsummary: {len(self.window)} ticks, {runs} runs, "
            f"duplicates={len(doubled)} misses={misses}"
        )
        _say("  runs per replica: " + "  ".join(f"{n}={c}" for n, c in runs_by.items()))
        _say(f"  backend: {self.backend_text(where=False)}")
        for problem in self.problems:
            _say(f"  problem: {problem}")
        if doubled or misses or self.problems:
            _say(f"FAILED; replica logs are in {self.log_dir}")
            return 1
        across = "on 1 replica" if self.count == 1 else f"across {self.count} replicas"
        _say(f"OK: every tick ran exactly once {across}")
        return 0

    # ---- stopping ----------------------------------------------------------------------

    def terminate(self) -> None:
        """Stop every replica (SIGTERM: a clean shutdown; SIGKILL after EXIT_TIMEOUT) and
        collect everything they wrote. Idempotent."""
        for replica in self.replicas.values():
            if replica.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    replica.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + EXIT_TIMEOUT
        for replica in self.replicas.values():
            try:
                replica.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                replica.proc.kill()
                replica.proc.wait()
        for replica in self.replicas.values():
            replica.reader.join(5.0)
            for pipe in (replica.proc.stdin, replica.proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def _by_replica(report: _Report) -> tuple[int, str]:
    number = report.replica.rpartition("-")[2]
    return (int(number) if number.isdigit() else 0, report.replica)


def _say(line: str) -> None:
    print(line, flush=True)


def _clock(at: datetime) -> str:
    return at.astimezone().strftime("%H:%M:%S")


def _one(report: _Report) -> str:
    """``ran on replica-2 (run 7, 3 ms late)`` and the like."""
    if report.kind != "ran":
        return f"{report.kind} on {report.replica} ({report.why})"
    late = "?" if report.late_ms is None else f"{round(report.late_ms)}"
    extra = "" if report.outcome in (None, "succeeded") else f", {report.outcome}"
    return f"ran on {report.replica} (run {report.run_id}, {late} ms late{extra})"


def _last_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {mask_dsn(' '.join(lines[-1].split()))}" if lines else ""


def _check(seconds: float, replicas: int, database_url: str | None) -> None:
    if not 1 <= seconds <= 3600:
        raise ValueError(f"--seconds must be between 1 and 3600, got {seconds:g}")
    if not 1 <= replicas <= 32:
        raise ValueError(f"--replicas must be between 1 and 32, got {replicas}")
    if database_url is not None:
        bad = ValueError(
            f"--database-url must be a PostgreSQL URL (postgresql://...) or libpq "
            f"key=value string, got {mask_dsn(database_url)!r}"
        )
        if not (_URL.match(database_url) or ("=" in database_url and "://" not in database_url)):
            raise bad
        from psycopg.conninfo import conninfo_to_dict  # ImportError: the extra is missing

        try:
            conninfo_to_dict(database_url)
        except Exception:
            raise bad from None


def run_demo(
    seconds: float = 15.0, replicas: int = 3, database_url: str | None = None, keep: bool = False
) -> int:
    """Run the demo (see the module's docstring); returns the exit status. Raises
    ``ValueError``/``ConfigurationError`` on bad input, before anything is started."""
    _check(seconds, replicas, database_url)
    state_dir = Path(tempfile.mkdtemp(prefix="replicron-demo-"))
    demo = _Demo(seconds, replicas, database_url, state_dir)
    previous = _on_signals(_interrupt)
    status = 1
    try:
        try:
            status = demo.run()
        except KeyboardInterrupt:
            status = 130
            print("replicron: interrupted; stopping the replicas", file=sys.stderr, flush=True)
        except ReplicaFailedError as exc:
            print(f"replicron: error: {exc}", file=sys.stderr, flush=True)
            print(f"replicron: replica logs are in {demo.log_dir}", file=sys.stderr, flush=True)
        finally:
            _on_signals(signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
            demo.terminate()
    finally:
        if keep or status == 1:
            if keep:
                print(f"state directory kept: {state_dir}", flush=True)
        else:
            shutil.rmtree(state_dir, ignore_errors=True)
        _restore(previous)
    return status


# ---- signals -------------------------------------------------------------------------------

_Handler = Callable[[int, FrameType | None], Any] | int | None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _on_signals(handler: _Handler) -> dict[int, _Handler]:
    """Handle SIGINT and SIGTERM with ``handler``; returns the previous handlers (none when
    not on the main thread, where signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def _restore(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
