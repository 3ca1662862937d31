"""One seed's simulation: replicas, the faults the seed draws for them, and the checks."""

from __future__ import annotations

import contextlib
import functools
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
from .replica import JOBS, SELDOM, Job, Mode, Replica
from .server import Server
from .world import Process, World

__all__ = ["Outcome", "found_by", "simulate"]

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
#: Faults happen in the first part; then every replica runs undisturbed long enough for a
#: janitor to end what the killed ones left open.
CHAOS = 90.0
CALM = 80.0
#: How long after the last fault every replica is expected to be back to running every tick.
RECOVERY = 35.0
REPLICAS = 3
#: How long a replica must have been able to reach the server before a tick's next one fell
#: due for that tick to run rather than be coalesced: a statement lost in an outage waits out
#: its deadline (5 s) and a reconnect (5 s) before the replica tries again, each second.
ABLE_FOR = 15.0
#: How often a world schedules ``SELDOM`` beside the other jobs.
_SELDOM_CHANCE = 0.5


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
    "cut": (1.0, 25.0, "partition {name} from the server for {seconds:.1f} s", Replica.partition),
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


#: The faults that strike the whole cluster at once: their shortest and longest span
#: (seconds), as the trace says them. A deploy or a switch cannot stop a replica that is
#: frozen or cut off (its host does not answer): it is left running, and its replacement
#: starts beside it, as an orchestrator does with a pod on a node it lost.
_CLUSTER_SPANS: dict[str, tuple[float, float, str]] = {
    # Longer than a statement's deadline and a reconnect together: every claim fails.
    "outage": (10.0, 30.0, "the server is down: every session ends; no answer for {seconds:.1f} s"),
    "deploy": (1.0, 20.0, "deploy: SIGTERM to every replica; new ones in {seconds:.1f} s"),
    "crash": (1.0, 20.0, "crash: kill -9 of every replica; new ones in {seconds:.1f} s"),
    "switch": (
        2.0,
        8.0,
        "mode switch to {mode}: each replica in turn, {seconds:.1f} s apart, SIGTERM and a "
        "new one in the other mode",
    ),
}
#: How often a seed draws one of them.
_CLUSTER_FAULT_CHANCE = 0.4
#: How often a seed draws somebody holding a lock on the ledger's tables for a while (a
#: long migration, ``LOCK TABLE``), and how long (seconds).
_LEDGER_LOCK_CHANCE = 0.25
_LEDGER_LOCK = (5.0, 40.0)
#: How long a process manager waits before it starts a replica whose start failed again.
RESTART_BACKOFF = 5.0


class _Faults:
    """The faults a seed draws, at random instants of the chaotic part: faults of one
    replica or the server, and now and then one of the whole cluster. The cluster's are
    drawn from a stream of their own, so a seed that draws none runs the world it always did."""

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
        cluster = random.Random(f"cluster faults of seed {sim.seed}")
        self.cluster: list[tuple[float, str, float]] = []
        if cluster.random() < _CLUSTER_FAULT_CHANCE:
            kind = cluster.choice(sorted(_CLUSTER_SPANS))
            shortest, longest, _ = _CLUSTER_SPANS[kind]
            at = _near_a_tick(cluster, cluster.uniform(10.0, CHAOS - 25.0))
            self.cluster.append((at, kind, cluster.uniform(shortest, longest)))
        server = random.Random(f"server faults of seed {sim.seed}")
        if server.random() < _LEDGER_LOCK_CHANCE:
            at = _near_a_tick(server, server.uniform(10.0, CHAOS - 5.0))
            self.cluster.append((at, "ledger_lock", server.uniform(*_LEDGER_LOCK)))
            self.cluster.sort()

    def due(self) -> None:
        while self.plan and self.plan[0][0] <= self.sim.world.now:
            _, kind, index = self.plan.pop(0)
            self.sim.fault(kind, index)
        while self.cluster and self.cluster[0][0] <= self.sim.world.now:
            _, kind, seconds = self.cluster.pop(0)
            self.sim.cluster_fault(kind, seconds)


class _Simulation:
    def __init__(self, seed: int, mode: Mode) -> None:
        self.seed, self.mode = seed, mode
        # Drawn from a stream of its own, like the cluster's faults: the world of a seed
        # that draws only the four jobs is the one it always was.
        workload = random.Random(f"workload of seed {seed}")
        self.jobs: tuple[Job, ...] = JOBS
        if workload.random() < _SELDOM_CHANCE:
            self.jobs += (SELDOM,)
        self.world = World(seed, START)
        self.server = Server(self.world, START)
        self.activity = Activity(self.world)
        self.replicas: list[Replica] = []
        self.by_process: dict[Process | None, Replica] = {}
        self.server_down_until = -1.0
        #: Spans (monotonic, from, to) in which no replica could reach the ledger.
        self.for_everyone: list[tuple[float, float]] = []
        #: The mode each replica's next process is started in (a mode switch changes it).
        self.modes: list[Mode] = [mode] * REPLICAS
        self.trace: list[str] = []
        self.generation = 0

    def replica(self, index: int) -> Replica:
        self.generation += 1
        offset = self.world.rng.uniform(-0.05, 0.05)
        name = f"r{index}.{self.generation}"
        mode = self.modes[index]
        replica = Replica(self.world, self.server, self.activity, name, mode, offset, self.jobs)
        if self.server_down_until > self.world.now:
            replica.cut(self.server_down_until - self.world.now)
        replica.on_failed_start = lambda: self._start_again(index, replica)
        self.by_process[replica.process] = replica
        if index < len(self.replicas):
            self.replicas[index] = replica
        else:
            self.replicas.append(replica)
        return replica

    def _start_again(self, index: int, failed: Replica) -> None:
        """A replica whose start failed exits; its process manager starts it again."""

        def again() -> None:
            if self.replicas[index] is failed:
                self._restart(index)

        self.world.call_later(RESTART_BACKOFF, again)

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
            self._server_down(down)
        elif kind == "restart":
            self.note(f"SIGTERM {target.name}, then a new one")
            target.stop()
            back = _near_a_tick(rng, self.world.now + rng.uniform(0.5, 5.0)) - self.world.now
            self.world.call_later(back, lambda: self._restart(index))

    def cluster_fault(self, kind: str, seconds: float) -> None:
        if kind == "ledger_lock":
            self.note(f"somebody locks the ledger's tables for {seconds:.1f} s")
            self.server.lock_ledger(seconds)
            self.for_everyone.append((self.world.now, self.world.now + seconds))
            return
        rng = self.world.rng
        other: Mode = "lease" if self.modes[0] == "advisory" else "advisory"
        self.note(_CLUSTER_SPANS[kind][2].format(seconds=seconds, mode=other))
        if kind == "outage":
            self._server_down(seconds)
            return
        if kind == "switch":
            for turn in range(REPLICAS):
                self.world.call_later(seconds * turn, functools.partial(self._switch, turn, other))
            return
        for index, replica in enumerate(self.replicas):
            if replica.process.dead:
                continue
            if kind == "crash":
                replica.kill()
            elif replica.unreachable:
                self.note(f"{replica.name} cannot be told to stop: left running")
            else:
                replica.stop()
            back = seconds + rng.uniform(0.0, 1.0)
            self.world.call_later(back, functools.partial(self._restart, index))

    def _server_down(self, seconds: float) -> None:
        """Every session ends, and nobody reaches the server for ``seconds``."""
        self.server.restart()
        self.server_down_until = max(self.server_down_until, self.world.now + seconds)
        self.for_everyone.append((self.world.now, self.world.now + seconds))
        for replica in self.by_process.values():
            if not replica.process.dead:
                replica.cut(seconds)

    def _switch(self, index: int, mode: Mode) -> None:
        """One replica of a rolling switch of modes: stopped, and a new one in ``mode``."""
        self.modes[index] = mode
        replica = self.replicas[index]
        if replica.process.dead:
            return  # it comes back in the new mode, whenever it was to come back
        if replica.unreachable:
            self.note(f"{replica.name} cannot be told to stop: left running; a new one ({mode})")
        else:
            self.note(f"SIGTERM {replica.name}, then a new one ({mode})")
            replica.stop()
        self.world.call_later(1.0, lambda: self._restart(index))

    def _restart(self, index: int) -> None:
        replica = self.replica(index)
        self.note(f"start {replica.name} ({replica.mode})")

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
        for job, tick in _ticks(self.jobs, *calm, rows.values()):
            row = rows.get((job, tick))
            if (job, tick) not in self.activity.started_ticks and not (
                row is not None
                and row.outcome == "skipped_overlap"
                and self.activity.running_at(job, (tick - START).total_seconds())
            ):
                what = "no record" if row is None else f"{row.outcome} ({row.error})"
                found.append(f"liveness: {job}@{tick:%H:%M:%S} did not run: {what}")
        return found

    def _missed_only_when_none_could_run(self) -> list[str]:
        """A tick is run however late, unless its job's next tick fell due first (DESIGN 5):
        a tick recorded missed (the last of a range) had no replica able to run it for
        ``ABLE_FOR`` seconds before then: up, not frozen, its link whole, the server up, and
        no replica of the other mode beside it (that refuses claims)."""
        found = []
        everyone = list(self.by_process.values())
        every = {job.name: job.every for job in self.jobs}
        for row in self.server.ledger.db.tables.runs.values():
            if row.outcome != "missed" or row.manual:
                continue
            last = row.scheduled_through or row.scheduled_at
            begin = (last - START).total_seconds()
            end = begin + every[row.job]
            if end > CHAOS + CALM - 5 or _modes_mixed(everyone, begin, end):
                continue
            for replica in everyone:
                able = _longest_able(replica, begin, end, self.for_everyone)
                if able >= ABLE_FOR:
                    found.append(
                        f"DESIGN 5: {row.job}@{last:%H:%M:%S} recorded missed ({row.error}), "
                        f"though {replica.name} could run it for {able:.1f} s before the next"
                    )
                    break
        return found

    def _limits(self) -> list[str]:
        """max_runs holds across the cluster: no more runs than that ever start."""
        found = []
        for job in self.jobs:
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
        found = list(self.activity.violations) + self.server.violations
        found += self._limits()
        found += self._missed_only_when_none_could_run()
        rows = self.server.ledger.db.tables.runs.values()
        recorded = {(row.job, row.scheduled_at) for row in rows}
        recordable = START + timedelta(seconds=20), self.world.instant(CHAOS + CALM - 30)
        for job, tick in _ticks(self.jobs, *recordable, rows):
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
    jobs: tuple[Job, ...], first: datetime, last: datetime, rows: Iterable[RunRow]
) -> Iterator[tuple[str, datetime]]:
    """Every tick of every job from ``first`` through ``last``; a job with ``max_runs`` has
    none after the tick of the row that reached it (the ledger counts a row written off as
    abandoned as a run: it may have started)."""
    counted = sorted((row.job, row.scheduled_at) for row in rows if row.outcome in RAN)
    for job in jobs:
        step = timedelta(seconds=job.every)
        tick = START + step * math.ceil((first - START) / step)
        ran = [t for name, t in counted if name == job.name]
        end = last
        if job.max_runs is not None and len(ran) >= job.max_runs:
            end = min(last, ran[job.max_runs - 1])
        while tick <= end:
            yield job.name, tick
            tick += step


def _longest_able(
    replica: Replica, begin: float, end: float, for_everyone: list[tuple[float, float]]
) -> float:
    """The longest stretch of ``begin``..``end`` in which ``replica`` was up and untroubled
    (by its own faults, and by those of the server, ``for_everyone``)."""
    start = max(begin, replica.born)
    stop = min(end, replica.ended if replica.ended is not None else end)
    longest = 0.0
    for low, high in [*sorted(replica.troubles + for_everyone), (stop, stop)]:
        if high <= start:
            continue
        longest = max(longest, min(low, stop) - start)
        start = max(start, high)
        if start >= stop:
            break
    return longest


def _modes_mixed(replicas: list[Replica], begin: float, end: float) -> bool:
    """Whether replicas of both modes were up at some time between ``begin`` and ``end``."""
    modes = {
        replica.mode
        for replica in replicas
        if replica.born < end and (replica.ended is None or replica.ended > begin)
    }
    return len(modes) > 1


def _connector(sim: _Simulation) -> Any:
    async def connect(conninfo: str, **options: Any) -> Any:
        # Also a replica already replaced at its index, still stopping.
        replica = sim.by_process.get(sim.world.current)
        if replica is None:
            raise AssertionError("a connection from no replica")
        return await replica.connect()

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
