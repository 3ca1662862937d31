"""A simulated replica process: ``AsyncScheduler`` over ``PostgresBackend`` with the defaults a
user gets, its jobs reporting what they really do to the log the invariants read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from replicron import AsyncScheduler, current_run, every
from replicron.postgres import PostgresBackend

from .activity import STEP, Activity
from .server import Link, Server, SimConnection
from .world import Process, World

__all__ = ["JOBS", "SELDOM", "Job", "Mode", "Replica"]

Mode = Literal["advisory", "lease"]
#: The connection string every replica is given (the simulated server answers it).
DSN = "postgresql://replicron@sim/replicron"


@dataclass(frozen=True)
class Job:
    name: str
    every: float
    #: How long a run works (seconds, from .. to), in steps of ``STEP``.
    works: tuple[float, float]
    max_runs: int | None = None
    leader: bool = False


JOBS = (
    Job("often", 2.0, (0.0, 1.5)),
    Job("long", 5.0, (2.0, 7.5)),
    Job("limited", 3.0, (0.0, 2.0), max_runs=12),
    Job("led", 1.0, (0.0, 0.5), leader=True),
)
#: A job whose ticks lie further apart than an outage lasts: a tick whose handling failed
#: is run once the backend answers, before the next tick could coalesce it.
SELDOM = Job("seldom", 30.0, (0.0, 3.0))


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
        jobs: tuple[Job, ...] = JOBS,
    ) -> None:
        self.world, self.server, self.activity = world, server, activity
        self.name = name
        self.mode = mode
        #: Told when the start fails (and the process exits).
        self.on_failed_start: Callable[[], None] = lambda: None
        self.process: Process = world.process(name, offset)
        self.link = Link(world, self.process, delay=self._delay)
        self.connections: list[SimConnection] = []
        self.slow_until = -1.0
        self.partitioned_until = -1.0
        self.born = world.now
        #: When it stopped claiming for good (killed, told to stop, exited).
        self.ended: float | None = None
        #: Spans (monotonic, from, to) in which it could not be counted on to reach the server.
        self.troubles: list[tuple[float, float]] = []
        world.current = self.process
        try:
            self.scheduler = AsyncScheduler(backend=PostgresBackend(DSN, coordination=mode))
            for job in jobs:
                self.scheduler.add_job(
                    every(timedelta(seconds=job.every)),
                    self._work,
                    job,
                    name=job.name,
                    max_runs=job.max_runs,
                    leader=job.leader,
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
            self.exit()
            self.on_failed_start()
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

    def _trouble(self, seconds: float) -> None:
        self.troubles.append((self.world.now, self.world.now + seconds))

    def _end(self) -> None:
        if self.ended is None:
            self.ended = self.world.now

    def kill(self) -> None:
        """kill -9: nothing more runs; the server ends its sessions once it notices."""
        self._end()
        self.process.dead = True
        for conn in self.connections:
            if not conn.closed:
                conn.killed(notice_after=self.world.rng.uniform(1.0, 12.0))

    @property
    def unreachable(self) -> bool:
        """Frozen or cut off: whoever would tell it to stop is not heard."""
        now = self.world.now
        frozen = self.process.frozen_until is not None and self.process.frozen_until > now
        return frozen or self.partitioned_until > now

    def exit(self) -> None:
        """The process exits: its sockets close, so the server ends their sessions at once."""
        self._end()
        self.process.dead = True
        for conn in self.connections:
            if not conn.closed:
                conn.killed(notice_after=0.0)

    def freeze(self, seconds: float) -> None:
        self._trouble(seconds)
        self.process.frozen_until = self.world.now + seconds

    def cut(self, seconds: float) -> None:
        """No message reaches the server or comes back (the server is down, say: the
        simulation counts that trouble for every replica at once)."""
        self.link.cut_until = self.world.now + seconds

    def partition(self, seconds: float) -> None:
        """The replica's host is cut off: from the server, and from whoever would stop it."""
        self._trouble(seconds)
        self.cut(seconds)
        self.partitioned_until = self.world.now + seconds

    def lossy(self, seconds: float) -> None:
        """A link that loses one message in five, either way."""
        self._trouble(seconds)
        self.link.loss = 0.2

        def over() -> None:
            self.link.loss = 0.0

        self.world.call_later(seconds, over)

    def slow(self, seconds: float) -> None:
        self._trouble(seconds)
        self.slow_until = self.world.now + seconds

    def stop(self) -> None:
        """A clean stop (SIGTERM): the scheduler shuts down; the process then exits."""
        self._end()

        async def stop() -> None:
            await self.scheduler.shutdown()
            self.process.dead = True

        self.process.spawn(stop())
