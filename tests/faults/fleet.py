"""The replica processes of one test: started directly, inside the network namespace, under
libfaketime or through a pgbouncer, and killed, paused, resumed or stopped on demand.

Replicas are real processes (``python -m tests.faults.replica``) started from the repository
root. Each writes its events to ``<id>.events.jsonl`` and its log to ``<id>.log`` in the
test's directory; a replica id started again after its process ended appends to the same
files (the events carry the pid). The fleet remembers when each process ended, for the
analysis: an unfinished run of a dead process counts as running until then.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeVar

from tests.faults.analysis import (
    AdvisoryLock,
    Analysis,
    Window,
    analyse,
    assert_invariants,
    read_events,
)
from tests.faults.cluster import Database
from tests.faults.faketime import faketime_env
from tests.faults.netns import NetworkNamespace
from tests.faults.pooler import PgBouncer, PoolMode
from tests.helpers import poll_until

__all__ = ["Fleet", "ReplicaProcess"]

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
# Looked up here, in the parent: the child between fork and exec only calls it.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclass
class ReplicaProcess:
    replica_id: str
    proc: subprocess.Popen[bytes]
    events_path: Path
    log_path: Path
    log_file: IO[bytes]
    where: str  # how it was started, for messages: "direct, namespace, faketime +30s"
    jobs: dict[str, float]
    expected_dead: bool = False
    paused: bool = False
    ended_mono: float | None = field(default=None)  # when it was seen gone (monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


class Fleet:
    """Starts and controls the replicas of one test against its database ``db``."""

    def __init__(
        self,
        db: Database,
        workdir: Path,
        *,
        netns: NetworkNamespace,
        pgbouncer: Callable[[PoolMode], PgBouncer],
    ) -> None:
        self.db, self.workdir, self.netns = db, workdir, netns
        self._pgbouncer = pgbouncer
        self.processes: list[ReplicaProcess] = []  # every process started, in order
        self.current: dict[str, ReplicaProcess] = {}  # the latest process of each id

    # ---- starting ----------------------------------------------------------------------------

    def start(
        self,
        replica_id: str,
        *,
        jobs: int = 4,
        every_s: float = 1.0,
        task_ms: int = 50,
        heartbeat_interval: float = 0.5,
        stale_after: float = 1.5,
        stop_timeout: float = 5.0,
        seconds: float = 120.0,
        fence_stale_holders: bool = False,
        in_namespace: bool = False,
        faketime: str | None = None,
        via: PoolMode | None = None,
        dsn: str | None = None,
    ) -> ReplicaProcess:
        """Start replica ``replica_id``: inside the network namespace (``in_namespace``),
        with its wall clock shifted (``faketime="+30s"``), through a pgbouncer (``via=
        "transaction"`` or ``"session"``), through ``dsn``, or directly. Does not wait for it: see
        :meth:`wait_ready`."""
        previous = self.current.get(replica_id)
        assert previous is None or not previous.alive(), f"{replica_id} is still running"
        host = self.netns.host_address if in_namespace else "127.0.0.1"
        if dsn is not None:
            pass  # given: through something of the test's own, such as a proxy
        elif via is None:
            dsn = self.db.cluster.dsn(self.db.name, host=host)
        else:
            dsn = self._pgbouncer(via).dsn(self.db.name, host=host)
        events_path = self.workdir / f"{replica_id}.events.jsonl"
        command = [
            sys.executable, "-m", "tests.faults.replica",
            "--dsn", dsn,
            "--replica-id", replica_id,
            "--events", str(events_path),
            "--jobs", str(jobs),
            "--every-s", str(every_s),
            "--task-ms", str(task_ms),
            "--heartbeat-interval", str(heartbeat_interval),
            "--stale-after", str(stale_after),
            "--stop-timeout", str(stop_timeout),
            "--seconds", str(seconds),
        ]  # fmt: skip
        if fence_stale_holders:
            command.append("--fence-stale-holders")
        if via == "session":  # declared, as replicron asks of a pooler in session mode
            command.append("--session-pooler")
        where = ["namespace" if in_namespace else "host"]
        if via is not None:
            where.append(f"pgbouncer {via}")
        if faketime is not None:
            where.append(f"faketime {faketime}")
        if in_namespace:
            command = self.netns.command(command)
        env = faketime_env(faketime) if faketime is not None else dict(os.environ)
        log_path = self.workdir / f"{replica_id}.log"
        log_file = log_path.open("ab")
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        replica = ReplicaProcess(
            replica_id, proc, events_path, log_path, log_file, ", ".join(where),
            {f"job-{i}": every_s for i in range(jobs)},
        )  # fmt: skip
        self.processes.append(replica)
        self.current[replica_id] = replica
        return replica

    def replica_id_of(self, pid: int) -> str:
        """The replica id of a process (events carry the pid)."""
        for replica in self.processes:
            if replica.pid == pid:
                return replica.replica_id
        raise KeyError(f"no replica process has pid {pid}")

    # ---- waiting -----------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Fail at once when a replica exited that should still be running."""
        for replica in self.processes:
            if not replica.alive() and not replica.expected_dead:
                self._ended(replica)
                raise AssertionError(
                    f"replica {replica.replica_id} ({replica.where}) exited early with "
                    f"{replica.proc.returncode}; its log:\n{_tail(replica.log_path)}"
                )

    def wait_until(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.05
    ) -> T:
        """Poll ``check`` until it returns something other than None/False; fail after
        ``timeout`` seconds or as soon as a replica dies unexpectedly."""
        return poll_until(what, check, timeout, every, before_each=self.check_alive)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every event so far of every replica (of kind ``kind``), in monotonic order."""
        paths = {replica.events_path for replica in self.processes}
        return [e for e in read_events(sorted(paths)) if kind is None or e["event"] == kind]

    def wait_ready(self, replica_ids: Iterable[str], timeout: float = 30.0) -> dict[str, float]:
        """Wait until each replica's current process has started its scheduler; return when
        (monotonic). Fails at once on a replica that could not start."""
        pids = {self.current[replica_id].pid: replica_id for replica_id in replica_ids}

        def ready() -> dict[str, float] | None:
            found = {}
            for event in self.events():
                replica_id = pids.get(event["pid"])
                if replica_id is None:
                    continue
                if event["event"] == "failed":
                    raise AssertionError(f"replica {replica_id} failed: {event['error']}")
                if event["event"] == "ready":
                    found[replica_id] = float(event["mono"])
            return found if len(found) == len(pids) else None

        return self.wait_until(f"replicas {sorted(pids.values())} to be ready", ready, timeout)

    def wait_ticks_finished(self, window: Window, timeout: float = 30.0) -> None:
        """Wait until every tick of every job in ``window`` has a finished run: for
        stretches without a fault, where each tick must run."""
        expected = {(job, tick) for job, every_s in self.jobs().items()
                    for tick in window.ticks(every_s)}  # fmt: skip

        def finished() -> bool:
            done = {(e["job"], datetime.fromisoformat(e["tick"])) for e in self.events("finish")}
            return expected <= done

        self.wait_until(f"every tick in {window} to finish", finished, timeout, every=0.1)

    # ---- faults and stopping -----------------------------------------------------------------

    def wait_exit(self, replica_id: str, timeout: float = 30.0) -> int:
        """Wait for a replica that is expected to end by itself (one refused at start writes a
        "failed" event and exits 2); return its exit code."""
        replica = self.current[replica_id]
        replica.expected_dead = True
        code = replica.proc.wait(timeout)
        self._ended(replica)
        return code

    def kill(self, replica_id: str) -> None:
        """``kill -9`` the replica and reap it."""
        replica = self.current[replica_id]
        replica.expected_dead = True
        replica.proc.send_signal(signal.SIGKILL)
        replica.proc.wait(10)
        self._ended(replica)

    def pause(self, replica_id: str) -> None:
        """SIGSTOP: the whole process freezes (as in a long GC pause or a stalled VM)."""
        replica = self.current[replica_id]
        replica.proc.send_signal(signal.SIGSTOP)
        replica.paused = True

    def resume(self, replica_id: str) -> None:
        replica = self.current[replica_id]
        replica.proc.send_signal(signal.SIGCONT)
        replica.paused = False

    def stop(
        self, replica_ids: Iterable[str] | None = None, timeout: float = 30.0
    ) -> dict[str, int]:
        """SIGTERM the replicas (by default every live one) at once and wait for them; one
        still running after ``timeout`` is killed (exit code -9). Returns the exit codes."""
        chosen = [
            r
            for r in self.current.values()
            if (replica_ids is None or r.replica_id in replica_ids) and r.alive()
        ]
        for replica in chosen:
            replica.expected_dead = True
            if replica.paused:
                self.resume(replica.replica_id)
            replica.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = {}
        for replica in chosen:
            try:
                codes[replica.replica_id] = replica.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                replica.proc.kill()
                codes[replica.replica_id] = replica.proc.wait(10)
            self._ended(replica)
        return codes

    def _ended(self, replica: ReplicaProcess) -> None:
        """Note when the process ended: its "stopped" event if it wrote one, else now."""
        if replica.ended_mono is not None:
            return
        stopped = [e for e in read_events([replica.events_path])
                   if e["event"] == "stopped" and e["pid"] == replica.pid]  # fmt: skip
        replica.ended_mono = float(stopped[-1]["mono"]) if stopped else time.monotonic()

    def close(self) -> None:
        """Kill and reap every process still running; close the log files."""
        for replica in self.processes:
            if replica.alive():
                replica.expected_dead = True
                replica.proc.kill()  # SIGKILL ends a stopped (SIGSTOP) process as well
            replica.proc.wait(10)
            self._ended(replica)
            replica.log_file.close()

    # ---- results -----------------------------------------------------------------------------

    def jobs(self) -> dict[str, float]:
        return {job: s for replica in self.processes for job, s in replica.jobs.items()}

    def leaked_locks(self, grace_s: float = 5.0) -> list[AdvisoryLock]:
        """The advisory locks still held in the database once every replica is down, after
        up to ``grace_s`` seconds for the server to end the sessions of processes that are
        gone (it takes a moment after a kill; after a partition, until the server's TCP
        keepalives give up on the peer)."""
        alive = [r.replica_id for r in self.processes if r.alive()]
        assert not alive, f"locks leak only once every replica is down; running: {alive}"
        deadline = time.monotonic() + grace_s
        while (locks := self.db.advisory_locks()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return locks

    def analyse(self, window: Window, *, leak_grace_s: float = 5.0) -> Analysis:
        """The analysis of everything that ran; every replica must be down (see
        :meth:`leaked_locks` for ``leak_grace_s``)."""
        leaked = self.leaked_locks(leak_grace_s)
        return analyse(
            events=self.events(),
            ledger=self.db.ledger(),
            jobs=self.jobs(),
            window=window,
            replica_ends={r.pid: r.ended_mono for r in self.processes if r.ended_mono is not None},
            leaked_locks=leaked,
        )

    def assert_invariants(
        self, window: Window, *, all_ran: bool = False, leak_grace_s: float = 5.0
    ) -> Analysis:
        """:meth:`analyse`, then fail on any broken promise (see
        :func:`tests.faults.analysis.assert_invariants`); returns the analysis."""
        analysis = self.analyse(window, leak_grace_s=leak_grace_s)
        assert_invariants(analysis, all_ran=all_ran)
        return analysis

    def logs(self) -> str:
        """Each replica id's log (all its processes), with how each process was started."""
        parts = []
        for replica_id in dict.fromkeys(r.replica_id for r in self.processes):
            mine = [r for r in self.processes if r.replica_id == replica_id]
            for replica in mine:
                replica.log_file.flush()
            heading = "; ".join(f"pid {r.pid} ({r.where}, exit {r.proc.poll()})" for r in mine)
            parts.append(f"----- {replica_id}: {heading} -----\n{_tail(mine[0].log_path, 400)}")
        return "\n".join(parts)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so that a pytest
    killed outright leaves no replica running (``ip netns exec`` and a preloaded libfaketime
    keep the setting: neither is set-user-ID). The signal comes when the *thread* that
    started the child ends: start replicas from the test's own thread."""
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
