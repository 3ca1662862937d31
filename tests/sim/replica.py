"""A simulated replica process: ``AsyncScheduler`` over ``PostgresBackend`` with the defaults a
user gets, its jobs reporting what they really do to the log the invariants read."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from replicron import AsyncScheduler, current_run, every
from replicron.postgres import PostgresBackend

from .server import Link, Server, SimConnection
from .world import Process, World

__all__ = ["JOBS", "Activity", "Replica", "Run"]

Mode = Literal["advisory", "lease"]
#: The connection string every replica is given (the simulated server answers it).
DSN = "postgresql://replicron@sim/replicron"


@dataclass(frozen=True)
class Job:
    name: str
    every: float
    #: How long a run works (seconds, from .. to), in steps of ``STEP``.
    works: tuple[float, float]


JOBS = (Job("often", 2.0, (0.0, 1.5)), Job("long", 5.0, (2.0, 7.5)))
STEP = 0.5


@dataclass
class Run:
    """A run as its task reports it: when it started, when it last did something."""

    job: str
    tick: datetime
    replica: str
    run_id: int | None
    start: float
    last: float
    overlapped: bool = False
    #: The task returned (it was not cut off): its outcome is to be written.
    returned: bool = False

    def __str__(self) -> str:
        return f"run {self.run_id} of {self.job}@{self.tick:%H:%M:%S} on {self.replica}"


@dataclass
class Activity:
    """What runs did, as the tasks themselves report it, checked as it happens: no tick runs
    twice (I1), no two runs of a job are active at once (I3)."""

    world: World
    started_ticks: dict[tuple[str, datetime], Run] = field(default_factory=dict)
    #: Per job, its runs that may still be active (started within the last minutes).
    recent: dict[str, list[Run]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def started(self, job: str, tick: datetime, replica: str, run_id: int | None) -> Run:
        now = self.world.now
        run = Run(job, tick, replica, run_id, now, now)
        first = self.started_ticks.setdefault((job, tick), run)
        if first is not run:
            self.violations.append(f"I1: {job}@{tick:%H:%M:%S.%f} ran twice: {first} and {run}")
        self.lines.append(f"{now:9.3f} {replica} starts {job}@{tick:%H:%M:%S} (run {run_id})")
        runs = self.recent.setdefault(job, [])
        runs[:] = [r for r in runs if r.last > now - 120.0]
        runs.append(run)
        self.active(run)
        return run

    def running_at(self, job: str, at: float) -> bool:
        """Whether a run of ``job`` was going on at monotonic ``at`` (within a step)."""
        return any(r.start <= at <= r.last + STEP for r in self.recent.get(job, ()))

    def active(self, run: Run) -> None:
        """``run`` did something now: no other run of its job may have been doing anything
        since it started."""
        now = self.world.now
        run.last = now
        for other in self.recent.get(run.job, ()):
            if other is run or other.overlapped or run.overlapped:
                continue
            if other.start <= now and other.last >= run.start:
                self.violations.append(
                    f"I3: {other} and {run} were both active at "
                    f"{max(other.start, run.start):.3f}..{min(other.last, now):.3f}"
                )
                other.overlapped = run.overlapped = True


class Replica:
    """One replica process and its scheduler."""

    def __init__(
        self,
        world: World,
        server: Server,
        activity: Activity,
        name: str,
        mode: Mode,
        offset: float = 0.0,
    ) -> None:
        self.world, self.server, self.activity = world, server, activity
        self.name = name
        self.process: Process = world.process(name, offset)
        self.link = Link(world, self.process, delay=self._delay)
        self.connections: list[SimConnection] = []
        self.slow_until = -1.0
        world.current = self.process
        try:
            self.scheduler = AsyncScheduler(backend=PostgresBackend(DSN, coordination=mode))
            for job in JOBS:
                self.scheduler.add_job(
                    every(timedelta(seconds=job.every)), self._work, job, name=job.name
                )
        finally:
            world.current = None
        self.process.spawn(self._main())

    def _delay(self) -> float:
        base = self.world.rng.uniform(0.0002, 0.003)
        if self.world.now < self.slow_until:
            base += self.world.rng.uniform(0.0, 2.0)
        return base

    async def _main(self) -> None:
        try:
            await self.scheduler.start()
        except Exception as exc:
            self.activity.lines.append(f"{self.world.now:9.3f} {self.name} failed to start: {exc}")
            return
        await asyncio.Event().wait()

    async def _work(self, job: Job) -> None:
        run = current_run()
        assert run is not None
        mine = self.activity.started(job.name, run.scheduled_at, self.name, run.run_id)
        steps = round(self.world.rng.uniform(*job.works) / STEP)
        for _ in range(steps):
            await asyncio.sleep(STEP)
            # As a task should: a run told to stop (its lease ended, though the loop may not
            # have said so yet after a freeze) does nothing more.
            if run.cancelled.is_set():
                return
            self.activity.active(mine)
        mine.returned = True

    async def connect(self) -> SimConnection:
        conn = await SimConnection.open(self.server, self.link)
        self.connections.append(conn)
        return conn

    # ---- faults --------------------------------------------------------------------------

    def kill(self) -> None:
        """kill -9: nothing more runs; the server ends its sessions once it notices."""
        self.process.dead = True
        for conn in self.connections:
            if not conn.closed:
                conn.killed(notice_after=self.world.rng.uniform(1.0, 12.0))

    def freeze(self, seconds: float) -> None:
        self.process.frozen_until = self.world.now + seconds

    def cut(self, seconds: float) -> None:
        self.link.cut_until = self.world.now + seconds

    def lossy(self, seconds: float) -> None:
        """A link that loses one message in five, either way."""
        self.link.loss = 0.2

        def over() -> None:
            self.link.loss = 0.0

        self.world.call_later(seconds, over)

    def slow(self, seconds: float) -> None:
        self.slow_until = self.world.now + seconds

    def stop(self) -> None:
        """A clean stop (SIGTERM): the scheduler shuts down; the process then exits."""

        async def stop() -> None:
            await self.scheduler.shutdown()
            self.process.dead = True

        self.process.spawn(stop())
