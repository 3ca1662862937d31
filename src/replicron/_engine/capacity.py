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
import math
from collections.abc import Callable, Iterable

from .planner import Tick

__all__ = ["MOST_ROUNDS_IN_HAND", "Spreader", "claim_margin"]

#: Runs are taken to last at least this long (seconds): a thread has overheads of its own.
_SHORTEST_RUN = 0.0005


#: Runs held in hand at most, in rounds of the threads: a run held here waits while another
#: replica might have started it, so a replica never hoards a burst however short its runs.
MOST_ROUNDS_IN_HAND = 8


def claim_margin(
    workers: int, round_trip: float | None = None, run_seconds: float | None = None
) -> int:
    """Runs claimed beyond the free threads, so that the threads have the next runs in hand
    while the next claim is on its way: as many as they finish in one claim's ``round_trip``
    (seconds) at ``run_seconds`` a run, once both are measured; until then half the threads.

    Short runs and slow claims make it large (5 ms runs on 10 threads, 30 ms claims: 60),
    so that a burst is worked off at the threads' pace, not a claim per handful of runs;
    long runs make it small (1 s runs: one), so that few runs wait here while another
    replica's threads are free."""
    if round_trip is None or run_seconds is None:
        return workers // 2
    in_one_round = math.ceil(workers * round_trip / max(run_seconds, _SHORTEST_RUN))
    return max(1, min(MOST_ROUNDS_IN_HAND * workers, in_one_round))


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
