"""One claim of the embedded backend: a batch of ticks claimed in one ledger transaction.

Each tick's row is inserted unless anybody has it (exactly one process's insert succeeds), or
unless its job has run its ``max_runs``. A tick of a paused job is recorded paused at once. A
tick that asks for the job's lock gets it only as the earliest of its job's ticks in the
batch, and only if no other run of the job may still be going; refused, it is recorded
skipped_overlap at once, so that no claim meanwhile counts it as a run of the job.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import NamedTuple

from replicron.events import Outcome

from ._file_locks import FileLocks
from ._ledger import Ledger
from ._micros import to_micros
from ._processes import Claimant
from ._sqlite_cluster import paused_jobs
from .base import Claim, ClaimRequest, ClaimStatus

__all__ = ["ClaimBatch"]

_REFUSED = "the job's lock is held by another run"
_PAUSED = "the job is paused"


class _Inserted(NamedTuple):
    """A tick whose row the claim inserted, to be run (not paused)."""

    job: str
    tick: int
    want_lock: bool
    run_id: int


class _Won(NamedTuple):
    """What the claim made of a tick whose row it inserted."""

    #: CLAIMED; PAUSED (recorded paused); or LOCKED: the job's lock was refused (recorded
    #: skipped_overlap) and the tick is not run.
    status: ClaimStatus
    run_id: int | None
    locked: bool


class ClaimBatch:
    """The ticks of one claim, for ``claimant``, with the run locks of ``locks``; the
    claimant's runs ``ended`` wait for their outcome and no longer count as going."""

    def __init__(
        self,
        claimant: Claimant,
        locks: FileLocks,
        lock_key: Callable[[str], int],
        ended: Collection[int] = (),
    ) -> None:
        self._claimant = claimant
        self._locks = locks
        self._lock_key = lock_key
        self._ended = ended
        self._won: dict[tuple[str, int], _Won] = {}
        self._exhausted: set[str] = set()  # jobs whose max_runs are used up
        self._taken: list[int] = []  # lock keys this claim took

    def write(self, conn: sqlite3.Connection, requests: Sequence[ClaimRequest]) -> None:
        """Claim the ticks of ``requests`` (each tick once) in ``conn``'s transaction. If it
        fails, :meth:`let_go` drops the locks it took."""
        self._take_locks(conn, self._insert(conn, requests))

    def let_go(self) -> None:
        """Drop the locks taken: the transaction that claimed their ticks was rolled back."""
        for key in self._taken:
            self._locks.unlock(key)

    def opened(self) -> Iterator[tuple[str, int]]:
        """(job, tick) of the ticks claimed that are left for the claimant to record."""
        return (tick for tick, won in self._won.items() if won.status is not ClaimStatus.PAUSED)

    def answer(self, request: ClaimRequest) -> Claim:
        job, at, _, manual, limit = request
        won = self._won.get((job, to_micros(at)))
        if won is not None and won.status is not ClaimStatus.LOCKED:
            return Claim(job, at, won.status, won.run_id, won.locked, manual)
        if limit is not None and not manual and job in self._exhausted:
            return Claim(job, at, ClaimStatus.EXHAUSTED, None, False)
        status = ClaimStatus.TAKEN if won is None else ClaimStatus.LOCKED
        return Claim(job, at, status, None, False, manual)

    def _insert(
        self, conn: sqlite3.Connection, requests: Sequence[ClaimRequest]
    ) -> list[_Inserted]:
        paused = paused_jobs(conn)  # in the claim's transaction: never a race
        inserted = []
        for request in requests:
            job, tick = request.job, to_micros(request.scheduled_at)
            limit = None if request.manual else request.max_runs
            if limit is not None and Ledger.runs_reached(conn, job, limit):
                self._exhausted.add(job)
                continue
            run_id = Ledger.insert_tick(conn, job, tick, request.manual, self._claimant)
            if run_id is not None and job in paused and not request.manual:
                Ledger.record(conn, job, tick, Outcome.PAUSED, None, None, _PAUSED)
                self._won[job, tick] = _Won(ClaimStatus.PAUSED, run_id, False)
            elif run_id is not None:
                inserted.append(_Inserted(job, tick, request.lock, run_id))
        return inserted

    def _take_locks(self, conn: sqlite3.Connection, inserted: list[_Inserted]) -> None:
        tried: set[str] = set()
        # The lock goes to the earliest tick of a job; its other ticks are LOCKED.
        for job, tick, want_lock, run_id in sorted(inserted):
            if not want_lock:
                self._won[job, tick] = _Won(ClaimStatus.CLAIMED, run_id, False)
                continue
            key = self._lock_key(job)
            if job not in tried and self._locks.try_lock(key, run_id):
                self._taken.append(key)
                if Ledger.start_alone(conn, job, run_id, self._ended):
                    self._won[job, tick] = _Won(ClaimStatus.CLAIMED, run_id, True)
                else:
                    self._locks.unlock(self._taken.pop())
            tried.add(job)
            if (job, tick) not in self._won:  # refused: the claimant records it again
                self._won[job, tick] = _Won(ClaimStatus.LOCKED, None, False)
                Ledger.record(conn, job, tick, Outcome.SKIPPED_OVERLAP, None, None, _REFUSED)
