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

Replicas try their ticks in different orders, so that they do not insert the same rows: a
claim of a row another claim inserted and has not yet committed waits for that commit, and
a replica that tried every tick of a burst would spend its claims learning that the others
took most of them. Where the backend tells which replicas share it, the orders are those of
rendezvous hashing (each job has a first replica, a second, ...), so that each replica
first works off a share of its own; else each replica's order is a hash of its own.

Pure bookkeeping, no I/O: the dispatcher asks, the engine claims.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from datetime import datetime

from .planner import Tick

__all__ = ["MOST_ROUNDS_IN_HAND", "PROMPTLY", "Spreader", "claim_margin"]

#: Seconds within which a run claimed here starts, at most, as far as the replica can tell:
#: its threads work off what it holds in hand in about this long.
PROMPTLY = 0.1
#: Runs held in hand at most, in rounds of the threads: a replica never takes a whole burst,
#: however short its runs seem.
MOST_ROUNDS_IN_HAND = 20
#: Runs are taken to last at least this long (seconds): a thread has overheads of its own.
_SHORTEST_RUN = 0.0005


def claim_margin(
    workers: int, round_trip: float | None = None, run_seconds: float | None = None
) -> int:
    """Runs claimed beyond the free threads: as many as the threads finish, at
    ``run_seconds`` a run, within ``PROMPTLY`` or within one claim's ``round_trip`` if
    that is longer (so that they never wait for the next claim), once both are measured;
    until then half the threads.

    Short runs make it large (5 ms runs on 10 threads: 200), so that a burst is worked off
    at the threads' pace from a claim or two made ahead of the instant, not a claim per
    handful of runs on the runs' path; long runs make it small (1 s runs: one), so that
    few runs wait here while another replica's threads are free."""
    if round_trip is None or run_seconds is None:
        return workers // 2
    horizon = max(PROMPTLY, round_trip)
    in_hand = math.ceil(workers * horizon / max(run_seconds, _SHORTEST_RUN))
    return max(1, min(MOST_ROUNDS_IN_HAND * workers, in_hand))


class Spreader:
    """The ticks this replica left for others, at most one per job (its oldest: a newer one
    coalesces it, as the planner does with a job that fell behind)."""

    def __init__(self, replica_id: str) -> None:
        self._me = replica_id
        self._peers: frozenset[str] = frozenset()
        self._ranks: dict[str, tuple[int, int]] = {}
        self.deferred: dict[str, Tick] = {}
        #: The first instant of the ticks held back for their first replica, and how many.
        self.held_until: datetime | None = None
        self._held = 0
        #: Leader mode, on the leader: whether this replica is first for ``job`` whatever
        #: the hashes (the leader claims every tick of a leader-mode job; the others none).
        self.first_for: Callable[[str], bool] | None = None

    def __bool__(self) -> bool:
        return bool(self.deferred)

    def see_peers(self, peers: frozenset[str]) -> None:
        """The replicas sharing the backend (this one among them, or not), as last seen."""
        if peers != self._peers:
            self._peers = peers
            self._ranks.clear()

    def rank(self, job: str) -> tuple[int, int]:
        """The job's place in this replica's order of first tries: rendezvous hashing over
        the peers. The replica whose hash of the job is highest tries it first of all, the
        second highest next, and so on: while each works off the jobs it is first for, no
        two insert the same rows, and a replica that has worked off its own goes on to help
        the others. Without peers known, a replica's own order."""
        first_for = self.first_for
        if first_for is not None and first_for(job):
            return (0, 0)
        rank = self._ranks.get(job)
        if rank is None:
            mine = _hash(self._me, job)
            beaten_by = sum(
                1 for peer in self._peers if peer != self._me and _hash(peer, job) > mine
            )
            rank = self._ranks[job] = (beaten_by, mine)
        return rank

    @property
    def holds_back(self) -> bool:
        """Whether ticks claimed ahead of their instant are left to their first replica."""
        return len(self._peers) > 1

    def split(
        self,
        ticks: Iterable[Tick],
        room: int,
        needs_thread: Callable[[str], bool],
        at: datetime,
    ) -> tuple[list[Tick], list[Tick]]:
        """Of ``ticks`` and those deferred before: the ones to claim now, and the deferred
        ones a newer tick of their job replaced (to be recorded missed).

        ``room``: runs this replica can start promptly. ``needs_thread(job)``: whether a tick
        of ``job`` would take a worker thread if claimed now (not an async job, not one
        skipped or queued behind a run of its job here). ``at``: the time now; a tick not
        yet due, whether it needs a thread or not, is claimed ahead only by its first
        replica, and by the others from its instant on (should its first replica have had
        no room, or be gone).
        """
        deferred = self.deferred
        pending = list(deferred.values())
        deferred.clear()
        pending.extend(ticks)
        # A tick may come twice (due, and found by a catch-up as its replica starts): once
        # is enough, and the second must not count as a newer tick replacing the first.
        pending = list(dict.fromkeys(pending))
        claim: list[Tick] = []
        candidates: list[Tick] = []
        held: list[Tick] = []
        rank, holds_back = self.rank, self.holds_back
        for tick in pending:
            if holds_back and tick.scheduled_at > at and rank(tick.job)[0]:
                held.append(tick)
            elif needs_thread(tick.job):
                candidates.append(tick)
            else:
                claim.append(tick)
        self.held_until = min((tick.scheduled_at for tick in held), default=None)
        self._held = len(held)
        if len(candidates) <= room and not held:
            return claim + candidates, []
        candidates.sort(key=lambda tick: (tick.scheduled_at, rank(tick.job)))
        taken = max(room, 0)
        left = candidates[taken:] + held
        left.sort(key=lambda tick: tick.scheduled_at)
        replaced: list[Tick] = []
        for tick in left:
            older = deferred.get(tick.job)
            if older is not None:  # sorted by instant: ``tick`` is the newer one
                replaced.append(older)
            deferred[tick.job] = tick
        return claim + candidates[:taken], replaced

    def all_held(self, at: datetime) -> bool:
        """Whether every deferred tick is held back for its first replica until after
        ``at``: nothing to claim yet, whatever the room."""
        return (
            self.held_until is not None
            and at < self.held_until
            and (self._held == len(self.deferred))
        )

    def take_all(self) -> list[Tick]:
        """At shutdown: every tick still deferred."""
        ticks = list(self.deferred.values())
        self.deferred.clear()
        return ticks


def _hash(replica: str, job: str) -> int:
    # The same on every replica (str's hash is salted per process); a real hash, since
    # CRC32 gives names that differ in one digit related places.
    digest = hashlib.blake2b(f"{replica}\0{job}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
