"""The listener the bench replicas of replicron count events with (bench/_pg_scale_replica.py,
bench/_pg_fleet_replica.py). A module of its own: _pg_scale_replica.py also runs under
APScheduler's interpreter, where replicron is not installed, and imports it only then."""

from __future__ import annotations

from collections import Counter

import replicron

__all__ = ["Counting"]


class Counting(replicron.Listener):
    """Counts events per tick (Unix seconds); runs on the scheduler's loop."""

    def __init__(self) -> None:
        self.taken: Counter[float] = Counter()
        self.missed: Counter[float] = Counter()
        self.skipped: Counter[float] = Counter()
        self.lock_errors = 0

    def on_taken(self, event: replicron.RunEvent) -> None:
        self.taken[event.scheduled_at.timestamp()] += 1

    def on_missed(self, event: replicron.RunEvent) -> None:
        self.missed[event.scheduled_at.timestamp()] += 1

    def on_skipped(self, event: replicron.RunEvent) -> None:
        self.skipped[event.scheduled_at.timestamp()] += 1

    def on_lock_error(self, event: replicron.RunEvent) -> None:
        self.lock_errors += 1

    def counts(self) -> dict[str, object]:
        """What a replica writes out: the events per tick, sorted by tick."""
        return {
            "taken": sorted(self.taken.items()),
            "missed": sorted(self.missed.items()),
            "skipped": sorted(self.skipped.items()),
            "lock_errors": self.lock_errors,
        }
