"""The replica processes of one test: started directly, inside the network namespace, under
libfaketime or through a pgbouncer, and killed, paused, resumed or stopped on demand.

Replicas are real processes (:mod:`tests._harness.replica`) started from the repository root
(see :class:`tests._harness.replicas.Replicas`). The fleet knows when each process ended, for
the analysis: an unfinished run of a dead process counts as running until then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from tests._harness.processes import Child
from tests._harness.replicas import Replicas
from tests.faults.analysis import (
    AdvisoryLock,
    Analysis,
    Window,
    analyse,
    assert_invariants,
    monotonic_at,
)
from tests.faults.cluster import Database
from tests.faults.faketime import faketime_env
from tests.faults.netns import NetworkNamespace
from tests.faults.pooler import PgBouncer, PoolMode

__all__ = ["Fleet", "both_modes"]

#: Runs a fault test once per coordination mode of :class:`~replicron.postgres.PostgresBackend`.
both_modes = pytest.mark.parametrize("coordination", ["advisory", "lease"])


class Fleet(Replicas):
    """Starts and controls the replicas of one test against its database ``db``."""

    def __init__(
        self,
        db: Database,
        workdir: Path,
        *,
        netns: NetworkNamespace,
        pgbouncer: Callable[[PoolMode], PgBouncer],
        coordination: str = "advisory",
    ) -> None:
        super().__init__(workdir)
        self.db, self.netns = db, netns
        #: The coordination mode of every replica this fleet starts.
        self.coordination = coordination
        self._pgbouncer = pgbouncer
        self._jobs: dict[str, float] = {}  # every job any replica ran, and its interval

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
        coordination: str | None = None,
        max_workers: int | None = None,
        leader: bool = False,
        fixed_delay: bool = False,
    ) -> Child:
        """Start replica ``replica_id``: inside the network namespace (``in_namespace``),
        with its wall clock shifted (``faketime="+30s"``), through a pgbouncer (``via=
        "transaction"`` or ``"session"``), through ``dsn``, or directly; in the fleet's mode
        unless ``coordination`` says another; with ``max_workers`` worker threads (by default
        one per job); in leader mode with ``leader``; ``fixed_delay``: each job is
        ``after(seconds=every_s)``. Does not wait for it: see :meth:`wait_ready`."""
        mode = coordination or self.coordination
        host = self.netns.host_address if in_namespace else "127.0.0.1"
        if dsn is not None:
            pass  # given: through something of the test's own, such as a proxy
        elif via is None:
            dsn = self.db.cluster.dsn(self.db.name, host=host)
        else:
            dsn = self._pgbouncer(via).dsn(self.db.name, host=host)
        where = ["namespace" if in_namespace else "host", f"{mode} mode"]
        if via is not None:
            where.append(f"pgbouncer {via}")
        if faketime is not None:
            where.append(f"faketime {faketime}")
        self._jobs |= {f"job-{i}": every_s for i in range(jobs)}
        options = {
            "dsn": dsn,
            "jobs": jobs,
            "every_s": every_s,
            "task_ms": task_ms,
            "heartbeat_interval": heartbeat_interval,
            "stale_after": stale_after,
            "stop_timeout": stop_timeout,
            "seconds": seconds,
            # by default every job's run can start on time
            "max_workers": max(8, jobs) if max_workers is None else max_workers,
            "fence_stale_holders": fence_stale_holders,
            # declared, as advisory mode asks of one (lease mode runs through any pooler)
            "session_pooler": via == "session" and mode == "advisory",
            "coordination": mode,
            "leader": leader,
            "fixed_delay": fixed_delay,
        }
        return self.spawn_replica(
            replica_id,
            options,
            wrap=self.netns.command if in_namespace else None,
            env=faketime_env(faketime) if faketime is not None else None,
            where=", ".join(where),
        )

    # ---- waiting -----------------------------------------------------------------------------

    def wait_ready(self, replica_ids: Iterable[str], timeout: float = 30.0) -> dict[str, float]:
        """Wait until each replica's current process has started its scheduler; return when
        (monotonic). Fails at once on a replica that could not start."""
        ready = self.ready_events(replica_ids, timeout)
        return {replica_id: float(event["mono"]) for replica_id, event in ready.items()}

    def wait_ticks_finished(self, window: Window, timeout: float = 30.0) -> None:
        """Wait until every tick of every job in ``window`` has a finished run: for
        stretches without a fault, where each tick must run."""
        expected = {
            (job, tick) for job, every_s in self.jobs().items() for tick in window.ticks(every_s)
        }

        def finished() -> bool:
            done = {(e["job"], datetime.fromisoformat(e["tick"])) for e in self.events("finish")}
            return expected <= done

        self.wait_until(f"every tick in {window} to finish", finished, timeout, every=0.1)

    def wait_window_end(self, window: Window, after: float = 0.0, timeout: float = 30.0) -> None:
        """Wait until ``after`` seconds past the end of ``window`` (its last ticks ran)."""
        end = monotonic_at(window.end) + after
        self.wait_until("the window to end", lambda: time.monotonic() > end, timeout)

    def run_without_faults(
        self,
        replica_ids: Sequence[str],
        seconds: float,
        *,
        settle: float = 0.5,
        timeout: float = 30.0,
        leak_grace_s: float = 5.0,
    ) -> tuple[Analysis, dict[str, int]]:
        """For a stretch without a fault: wait until the replicas are ready, let a window of
        ``seconds`` (from ``settle`` seconds after the last was ready) run until each of its
        ticks has finished, stop every replica and check every invariant, each tick run.
        The analysis and the exit codes."""
        ready = self.wait_ready(replica_ids, timeout)
        start = max(ready.values()) + settle
        window = Window.from_monotonic(start, start + seconds)
        self.wait_ticks_finished(window, timeout)
        codes = self.stop()
        return self.assert_invariants(window, all_ran=True, leak_grace_s=leak_grace_s), codes

    # ---- results -----------------------------------------------------------------------------

    def jobs(self) -> dict[str, float]:
        return dict(self._jobs)

    def replica_ends(self) -> dict[int, float]:
        """When each process that is gone ended (monotonic): its "stopped" event if it wrote
        one, else when it was first seen gone."""
        ends = {}
        for child in self.children:
            stopped = self.stopped(child)
            if stopped is not None:
                ends[child.pid] = float(stopped["mono"])
            elif child.ended_mono is not None:
                ends[child.pid] = child.ended_mono
        return ends

    def leaked_locks(self, grace_s: float = 5.0) -> list[AdvisoryLock]:
        """The advisory locks still held in the database once every replica is down, after
        up to ``grace_s`` seconds for the server to end the sessions of processes that are
        gone (it takes a moment after a kill; after a partition, until the server's TCP
        keepalives give up on the peer)."""
        alive = [child.name for child in self.children if child.alive()]
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
            replica_ends=self.replica_ends(),
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
