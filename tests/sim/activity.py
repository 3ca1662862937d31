"""What the simulated runs did, as their tasks report it, checked as it happens: no tick runs
twice (I1), no two runs of a job are active at once (I3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .world import World

__all__ = ["Activity", "Run"]

#: How far apart (seconds) a run's task reports that it is still working.
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
