"""One seed's simulation: replicas, the faults the seed draws for them, and the checks."""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import psycopg

from replicron.postgres._reference import RunRow
from replicron.postgres._reference.tables import RAN

from .activity import Activity
from .mutations import mutated
from .replica import JOBS, Mode, Replica
from .server import Server
from .world import World

__all__ = ["Outcome", "found_by", "simulate"]

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
#: Faults happen in the first part; then every replica runs undisturbed long enough for a
#: janitor to end what the killed ones left open.
CHAOS = 90.0
CALM = 80.0
#: How long after the last fault every replica is expected to be back to running every tick.
RECOVERY = 35.0
REPLICAS = 3


@dataclass
class Outcome:
    seed: int
    mode: Mode
    violations: list[str]
    trace: list[str]
    statements: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        lines = [f"seed {self.seed} ({self.mode}): {len(self.violations)} violation(s)"]
        lines += [f"  {v}" for v in self.violations[:10]]
        lines += ["trace (last 60 lines):", *self.trace[-60:]]
        lines.append(f"replay: bash scripts/simulate --seed {self.seed} --mode {self.mode}")
        return "\n".join(lines)


#: The faults that last a while: their shortest and longest span (seconds), how the trace
#: says them, and what they do to a replica.
_SPANS: dict[str, tuple[float, float, str, Callable[[Replica, float], None]]] = {
    "freeze": (1.0, 30.0, "SIGSTOP {name} for {seconds:.1f} s", Replica.freeze),
    "cut": (1.0, 25.0, "partition {name} from the server for {seconds:.1f} s", Replica.cut),
    "slow": (
        2.0,
        20.0,
        "slow link of {name} (up to 2 s a message) for {seconds:.1f} s",
        Replica.slow,
    ),
    "lossy": (
        2.0,
        20.0,
        "lossy link of {name} (a message in 5 lost) for {seconds:.1f} s",
        Replica.lossy,
    ),
}


def _near_a_tick(rng: random.Random, at: float) -> float:
    """``at``, or as often a moment (up to 150 ms) before the whole second next to it, where
    the jobs' ticks fall: what a replica does within a claim's lead of a tick is where
    timing bugs hide, and a uniform draw seldom lands there."""
    if rng.random() < 0.5:
        return at
    return max(0.0, round(at) - rng.uniform(0.0, 0.15))


class _Faults:
    """The faults a seed draws, at random instants of the chaotic part."""

    KINDS = ("kill", "freeze", "cut", "slow", "lossy", "restart", "server_restart")

    def __init__(self, sim: _Simulation) -> None:
        self.sim = sim
        rng = sim.world.rng
        self.plan = sorted(
            (
                _near_a_tick(rng, rng.uniform(10.0, CHAOS - 5.0)),
                rng.choice(self.KINDS),
                rng.randrange(REPLICAS),
            )
            for _ in range(rng.randint(1, 5))
        )

    def due(self) -> None:
        while self.plan and self.plan[0][0] <= self.sim.world.now:
            _, kind, index = self.plan.pop(0)
            self.sim.fault(kind, index)


class _Simulation:
    def __init__(self, seed: int, mode: Mode) -> None:
        self.seed, self.mode = seed, mode
        self.world = World(seed, START)
        self.server = Server(self.world, START)
        self.activity = Activity(self.world)
        self.replicas: list[Replica] = []
        self.trace: list[str] = []
        self.generation = 0

    def replica(self, index: int) -> Replica:
        self.generation += 1
        offset = self.world.rng.uniform(-0.05, 0.05)
        replica = Replica(
            self.world, self.server, self.activity, f"r{index}.{self.generation}", self.mode, offset
        )
        if index < len(self.replicas):
            self.replicas[index] = replica
        else:
            self.replicas.append(replica)
        return replica

    def note(self, line: str) -> None:
        self.trace.append(f"{self.world.now:9.3f} {line}")

    def fault(self, kind: str, index: int) -> None:
        rng, target = self.world.rng, self.replicas[index]
        if target.process.dead:
            return
        if kind == "kill":
            target.kill()
            back = _near_a_tick(rng, self.world.now + rng.uniform(0.0, 20.0)) - self.world.now
            self.note(f"kill -9 {target.name}; a new one in {back:.1f} s")
            self.world.call_later(back, lambda: self._restart(index))
        elif kind in _SPANS:
            shortest, longest, what, act = _SPANS[kind]
            seconds = rng.uniform(shortest, longest)
            self.note(what.format(name=target.name, seconds=seconds))
            act(target, seconds)
        elif kind == "server_restart":
            down = rng.uniform(0.5, 8.0)
            self.note(f"server restart: every session ends; no answer for {down:.1f} s")
            self.server.restart()
            for replica in self.replicas:
                replica.cut(down)
        elif kind == "restart":
            self.note(f"SIGTERM {target.name}, then a new one")
            target.stop()
            back = _near_a_tick(rng, self.world.now + rng.uniform(0.5, 5.0)) - self.world.now
            self.world.call_later(back, lambda: self._restart(index))

    def _restart(self, index: int) -> None:
        replica = self.replica(index)
        self.note(f"start {replica.name}")

    def rows_by_tick(self) -> dict[tuple[str, datetime], RunRow]:
        return {
            (row.job, row.scheduled_at): row for row in self.server.ledger.db.tables.runs.values()
        }

    def _outcomes_written(self) -> list[str]:
        """I6 for runs: each run that returned on a replica still up at the end had its
        outcome brought to the server: written (succeeded), or refused there because a
        janitor had written the row off first (its replica could not renew it for a lease's
        length). Else its record says abandoned though its holder lived."""
        found = []
        rows = self.rows_by_tick()
        living = {r.name for r in self.replicas if not r.process.dead}
        for run in self.activity.started_ticks.values():
            if not run.returned or run.replica not in living or run.last > CHAOS + CALM - 20:
                continue
            row = rows.get((run.job, run.tick))
            if row is not None and (
                row.outcome == "succeeded" or row.run_id in self.server.released
            ):
                continue
            outcome = None if row is None else row.outcome
            found.append(
                f"I6: {run} returned, but its outcome never reached the server ({outcome!r})"
            )
        return found

    def _calm_liveness(self) -> list[str]:
        """Once every replica has been up and reachable for a while, every tick runs, unless
        its job was running at its instant (recorded skipped_overlap): none is lost to a
        replica's leftovers (a lock, an open row, a stale belief) from the faults."""
        found = []
        rows = self.rows_by_tick()
        calm = self.world.instant(CHAOS + RECOVERY), self.world.instant(CHAOS + CALM - 15)
        for job, tick in _ticks(*calm, rows.values()):
            row = rows.get((job, tick))
            if (job, tick) not in self.activity.started_ticks and not (
                row is not None
                and row.outcome == "skipped_overlap"
                and self.activity.running_at(job, (tick - START).total_seconds())
            ):
                what = "no record" if row is None else f"{row.outcome} ({row.error})"
                found.append(f"liveness: {job}@{tick:%H:%M:%S} did not run: {what}")
        return found

    def _limits(self) -> list[str]:
        """max_runs holds across the cluster: no more runs than that ever start."""
        found = []
        for job in JOBS:
            if job.max_runs is None:
                continue
            started = [
                run for (name, _), run in self.activity.started_ticks.items() if name == job.name
            ]
            if len(started) > job.max_runs:
                found.append(
                    f"max_runs: {job.name} started {len(started)} runs, past its {job.max_runs}"
                )
        return found

    def final_checks(self) -> list[str]:
        found = list(self.activity.violations)
        found += self._limits()
        rows = self.server.ledger.db.tables.runs.values()
        recorded = {(row.job, row.scheduled_at) for row in rows}
        recordable = START + timedelta(seconds=20), self.world.instant(CHAOS + CALM - 30)
        for job, tick in _ticks(*recordable, rows):
            if (job, tick) not in recorded:
                found.append(f"I6: {job}@{tick:%H:%M:%S} has no record")
        found += self._calm_liveness()
        found += self._outcomes_written()
        open_rows = [
            row
            for row in rows
            if row.outcome is None and row.scheduled_at < self.world.instant(CHAOS)
        ]
        for row in open_rows:
            found.append(
                f"I6: {row.job}@{row.scheduled_at:%H:%M:%S} (run {row.run_id} of "
                f"{row.replica_id}) is still open"
            )
        return found


def _ticks(
    first: datetime, last: datetime, rows: Iterable[RunRow]
) -> Iterator[tuple[str, datetime]]:
    """Every tick of every job from ``first`` through ``last``; a job with ``max_runs`` has
    none after the tick of the row that reached it (the ledger counts a row written off as
    abandoned as a run: it may have started)."""
    counted = sorted((row.job, row.scheduled_at) for row in rows if row.outcome in RAN)
    for job in JOBS:
        step = timedelta(seconds=job.every)
        tick = START + step * math.ceil((first - START) / step)
        ran = [t for name, t in counted if name == job.name]
        end = last
        if job.max_runs is not None and len(ran) >= job.max_runs:
            end = min(last, ran[job.max_runs - 1])
        while tick <= end:
            yield job.name, tick
            tick += step


def _connector(sim: _Simulation) -> Any:
    async def connect(conninfo: str, **options: Any) -> Any:
        process = sim.world.current
        for replica in sim.replicas:
            if replica.process is process:
                return await replica.connect()
        raise AssertionError("a connection from no replica")

    return connect


class _Told(logging.Handler):
    """The replicas' warnings, into the trace with the replica that said them."""

    def __init__(self, sim: _Simulation) -> None:
        super().__init__(logging.WARNING)
        self._sim = sim

    def emit(self, record: logging.LogRecord) -> None:
        process = self._sim.world.current
        who = process.name if process is not None else "-"
        self._sim.note(f"{who} says: {record.getMessage()}")


@contextlib.contextmanager
def _logs_into(sim: _Simulation) -> Iterator[None]:
    """The replicas' logs are the simulation's business, not the terminal's: their warnings
    go into the trace."""
    logger = logging.getLogger("replicron")
    asyncio_logger = logging.getLogger("asyncio")
    told = _Told(sim)
    saved = logger.level, logger.propagate, asyncio_logger.level
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.addHandler(told)
    asyncio_logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.removeHandler(told)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        asyncio_logger.setLevel(saved[2])


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """What the replicas say as the world ends (their tasks cancelled) is nobody's business."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def simulate(
    seed: int, mode: Mode, mutation: str | None = None, statements: bool = False
) -> Outcome:
    sim = _Simulation(seed, mode)
    if statements:
        sim.server.tell = sim.trace.append
    faults = _Faults(sim)
    with (
        sim.world.installed(seed),
        mutated(mutation),
        mock.patch.object(psycopg.AsyncConnection, "connect", _connector(sim)),
    ):
        with _logs_into(sim):
            for index in range(REPLICAS):
                sim.replica(index)
            sim.world.run_until(CHAOS + CALM, faults.due)
            violations = sim.final_checks()
        with _silenced():
            for process in sim.world.processes:
                process.end()
    trace = sorted(sim.trace + sim.activity.lines, key=lambda line: float(line.split()[0]))
    return Outcome(seed, mode, violations, trace, sim.server.statements)


def found_by(mutation: str, seed: int, mode: Mode, statements: bool = False) -> Outcome:
    """``seed`` with ``mutation`` put back, keeping only the violations the same seed does
    not show without it: what the fault itself breaks."""
    outcome = simulate(seed, mode, mutation, statements)
    if not outcome.ok:
        known = set(simulate(seed, mode).violations)
        outcome.violations = [v for v in outcome.violations if v not in known]
    return outcome
