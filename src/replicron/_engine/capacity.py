"""Claiming by capacity: at an instant a replica claims only the runs it can start promptly,
and leaves the rest for replicas with free worker threads.

Replicas sharing a backend all wake at an instant and all try its ticks. Were each to claim
every tick it could, the fastest to wake would take the whole burst and work it off on its
own threads while the others' threads idled (and ticks of its jobs that came round again
meanwhile would be skipped as overlapping). So a replica claims, of the ticks that would take
one of its worker threads, as many as it has threads free plus a margin (so that its threads
never wait for the next claim); it keeps the others *deferred*, and claims more of them as its
runs finish. Every replica does the same, so the burst is pulled by whoever has a free thread.
A deferred tick that another replica claimed meanwhile is answered "taken"; one whose job
falls due again before anybody had a thread for it is recorded missed.

Replicas try their ticks in different orders (a hash of replica and job), so their first
claims of a burst do not all insert the same rows.

Pure bookkeeping, no I/O: the dispatcher asks, the engine claims.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from .planner import Tick

__all__ = ["Spreader", "claim_margin"]


def claim_margin(workers: int) -> int:
    """Runs claimed beyond the free threads, so that the threads have the next runs in hand
    while the next claim is on its way. Half the threads: a run held here waits while
    another replica might have started it, so the margin is kept below a full round."""
    return workers // 2


class Spreader:
    """The ticks this replica left for others, at most one per job (its oldest: a newer one
    coalesces it, as the planner does with a job that fell behind)."""

    def __init__(self, replica_id: str) -> None:
        self._salt = replica_id.encode() + b"\0"
        self._ranks: dict[str, int] = {}
        self.deferred: dict[str, Tick] = {}

    def __bool__(self) -> bool:
        return bool(self.deferred)

    def rank(self, job: str) -> int:
        """The job's place in this replica's order of first tries."""
        rank = self._ranks.get(job)
        if rank is None:
            # A real hash: CRC32 gives names that differ in one digit related places.
            digest = hashlib.blake2b(self._salt + job.encode(), digest_size=8).digest()
            rank = self._ranks[job] = int.from_bytes(digest, "big")
        return rank

    def split(
        self, ticks: Iterable[Tick], room: int, needs_thread: Callable[[str], bool]
    ) -> tuple[list[Tick], list[Tick]]:
        """Of ``ticks`` and those deferred before: the ones to claim now, and the deferred
        ones a newer tick of their job replaced (to be recorded missed).

        ``room``: runs this replica can start promptly. ``needs_thread(job)``: whether a tick
        of ``job`` would take a worker thread if claimed now (not an async job, not one
        skipped or queued behind a run of its job here).
        """
        deferred = self.deferred
        now: list[Tick] = []
        candidates = list(deferred.values())
        deferred.clear()
        for tick in ticks:
            (candidates if needs_thread(tick.job) else now).append(tick)
        if len(candidates) <= room:
            return now + candidates, []
        rank = self.rank
        candidates.sort(key=lambda tick: (tick.scheduled_at, rank(tick.job)))
        taken = max(room, 0)
        replaced: list[Tick] = []
        for tick in candidates[taken:]:
            older = deferred.get(tick.job)
            if older is not None:  # sorted by instant: ``tick`` is the newer one
                replaced.append(older)
            deferred[tick.job] = tick
        return now + candidates[:taken], replaced

    def take_all(self) -> list[Tick]:
        """At shutdown: every tick still deferred."""
        ticks = list(self.deferred.values())
        self.deferred.clear()
        return ticks
