"""The embedded backend: several processes on one host coordinate through a state directory.

No server: gunicorn/uvicorn workers or a few daemons on one machine share ``state_dir``.

* **Once per tick**: a tick is claimed by inserting its unique ``(job, scheduled_at)`` row into
  the SQLite ledger ``state_dir/replicron.sqlite3`` (WAL) with ``ON CONFLICT DO NOTHING``; one
  transaction per batch of claims. Exactly one process's insert succeeds, whatever the timing.
* **No overlap**: a run holds the job's OS file lock ``state_dir/locks/<key>.lock`` (``flock``
  through :mod:`filelock`, never waiting), which the kernel drops when the process dies, plus an
  in-process guard (a process must not take a lock it holds; ``filelock`` locks re-enter). A run
  may start only if it gets the lock *and* no other started, unfinished run of the job belongs
  to a live process (a run whose lock was dropped may still be going).
* **Nothing left open**: rows record their claimant's pid; the open rows of a process that died
  are recorded ``abandoned`` when another process takes the job's lock, and by a janitor that
  runs at :meth:`~EmbeddedBackend.open` and every ``janitor_interval`` seconds during claims.

SQLite calls and file locks block (a write waits up to ``busy_timeout`` for another process's
transaction): they run on a thread of the backend's own, one at a time and in order, never on
the caller's event loop. A caller cancelled meanwhile is let go at once; what its call took is
let go of too (see ``_call``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from replicron.errors import ConfigurationError, StateDirError
from replicron.events import Outcome
from replicron.keys import LockKeyRegistry, job_lock_key

from ._ledger import Ledger
from ._micros import from_micros, to_micros
from ._processes import Claimant, process_start
from ._sqlite_cluster import (
    ClusterMethods,
    paused_jobs,
    prune_registry,
    register_replica,
    replica_stopped,
)
from ._state_dir import LEDGER_NAME, prepare_locks_dir, prepare_state_dir
from .base import (
    Claim,
    ClaimRequest,
    ClaimStatus,
    Release,
    RunRecord,
    answer_each,
    once_per_tick,
    taken_repeat,
    unrecorded_repeat,
)

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = ["LEDGER_NAME", "LOCKS_DIR", "EmbeddedBackend"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

LOCKS_DIR = "locks"
_MASK64 = (1 << 64) - 1
#: Rows deleted per transaction, and transactions per janitor run, when pruning.
_PRUNE_BATCH, _PRUNE_BATCHES = 1000, 20

#: Lock files held by any handle in this process: ``flock`` keeps handles of one process apart
#: too, but not where the system emulates it with ``fcntl`` locks (NFS, some Unixes).
_process_held: set[str] = set()
_process_guard = threading.Lock()

#: Why a tick refused the job's lock is recorded skipped_overlap by the claim itself.
_REFUSED = "the job's lock is held by another run"
_PAUSED = "the job is paused"


class EmbeddedBackend(ClusterMethods):
    """Coordinates the processes of one host that share ``state_dir`` (created if missing).

    ``busy_timeout``: how long a write waits for another process's transaction (seconds).
    Finished rows older than ``retention`` are pruned, keeping each job's latest; the janitor
    (abandoning the open rows of dead processes, pruning) runs every ``janitor_interval``
    seconds, when claims are made.
    """

    #: Replicas in other processes claim from this backend too: a scheduler claims at an
    #: instant only what it can start promptly and leaves the rest to them.
    spreads_bursts = True

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        retention: timedelta = timedelta(days=14),
        janitor_interval: float = 60.0,
    ) -> None:
        if sys.platform == "win32":
            raise ConfigurationError("EmbeddedBackend needs a POSIX system (Linux, macOS, BSD)")
        if sqlite3.sqlite_version_info < (3, 24, 0):
            raise ConfigurationError(
                "EmbeddedBackend needs SQLite 3.24 or later;"
                f" this Python has {sqlite3.sqlite_version}"
            )
        if not busy_timeout > 0:
            raise ConfigurationError("busy_timeout must be positive")
        if not janitor_interval > 0:
            raise ConfigurationError("janitor_interval must be positive")
        if retention <= timedelta(0):
            raise ConfigurationError("retention must be positive")
        self.state_dir = Path(state_dir)
        self.busy_timeout = busy_timeout
        self.retention = retention
        self.janitor_interval = janitor_interval
        self.replica_id = ""
        self._ledger: Ledger | None = None
        self._locks_dir = self.state_dir / LOCKS_DIR
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        self._keys = LockKeyRegistry(self.lock_key)
        # lock key -> this handle's lock object and its path
        self._file_locks: dict[int, tuple[FileLock, str]] = {}
        self._held: dict[int, int] = {}  # lock key -> run id holding it in this handle
        self._open: set[tuple[str, int]] = set()  # (job, tick) of our claimed, unrecorded ticks
        self._claimant = Claimant("", os.getpid(), None)
        self._next_janitor = 0.0
        self._io: ThreadPoolExecutor | None = None  # the thread every blocking call runs on

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / LEDGER_NAME

    # ---- Backend protocol ----------------------------------------------------------------

    def register_job(self, name: str) -> None:
        self._keys.register(name)

    def unregister_job(self, name: str) -> None:
        self._keys.unregister(name)

    def lock_key(self, job: str) -> int:
        return job_lock_key(job)

    def lock_path(self, job: str) -> Path:
        """The job's lock file: its lock key as 16 hex digits."""
        return self._locks_dir / f"{self.lock_key(job) & _MASK64:016x}.lock"

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        if self._ledger is not None or self._io is not None:
            raise ConfigurationError("this EmbeddedBackend is open already")
        self._io = io = ThreadPoolExecutor(1, thread_name_prefix=f"replicron-embedded-{replica_id}")
        try:
            await self._call(self._open_ledger, replica_id, on_lock_lost)
        except BaseException:
            # Failed, or cancelled while the ledger was being opened (which goes on): whatever
            # was opened is closed behind it, and the thread ends once that is done.
            self._io = None
            io.submit(self._close_ledger)
            io.shutdown(wait=False)
            raise

    async def close(self) -> None:
        io, self._io = self._io, None  # calls from now on are refused
        if io is None:
            return
        closing = io.submit(self._close_ledger)  # behind the calls under way
        try:
            await _complete(closing)
        finally:
            # Joined once its last call is done (at once, then); if close() itself was
            # cancelled, the thread still closes the ledger, and ends after it.
            io.shutdown(wait=closing.done())

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        return await self._call(self._claim, requests, give_back=self._give_back_claims)

    async def lock(self, claim: Claim) -> bool:
        return await self._call(
            self._lock, claim, give_back=lambda locked: self._give_back_lock(claim, locked)
        )

    async def release(self, releases: Sequence[Release]) -> None:
        if releases:
            await self._call(self._release, releases)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[bool | None]:
        return await self._call(self._record_unclaimed, records) if records else []

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        return await self._call(self._last_ticks, jobs) if jobs else {}

    async def _call(
        self, work: Callable[..., _T], *args: Any, give_back: Callable[[_T], None] | None = None
    ) -> _T:
        """``work(*args)`` on the backend's own thread: one call at a time, in the order they
        were made, never on the caller's loop. Its transaction ends whole (committed, or
        rolled back with the locks it took) whatever happens to the caller.

        If the caller is cancelled, a call without ``give_back`` (recording outcomes) still
        runs to its end. One with ``give_back`` (claiming, locking) is dropped if it has not
        begun; if it has, it runs to its end and then ``give_back`` lets go of what it took,
        which the caller never heard of: nobody would run its ticks or drop their locks.
        """
        io = self._io
        if io is None:
            raise ConfigurationError("the EmbeddedBackend is not open")
        call = io.submit(work, *args)
        if give_back is None:
            return await _complete(call)
        try:
            return await asyncio.wrap_future(call)
        except asyncio.CancelledError:
            if not call.cancel():  # it has begun (or ended): it is given back right after
                with contextlib.suppress(RuntimeError):  # closed meanwhile: close() did it
                    io.submit(self._give_back, call, give_back)
            raise

    def _open_ledger(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None
    ) -> None:
        self.replica_id = replica_id
        if on_lock_lost is not None:  # never called: a file lock is only lost with its process
            self._on_lock_lost = on_lock_lost
        pid = os.getpid()
        self._claimant = Claimant(replica_id, pid, process_start(pid))
        directory = prepare_state_dir(self.state_dir)
        ledger = Ledger(directory / LEDGER_NAME, self.busy_timeout)
        try:
            prepare_locks_dir(directory / LOCKS_DIR)
            self._janitor(ledger)
            with ledger.write() as conn:
                register_replica(conn, self._claimant)
        except sqlite3.Error as exc:
            ledger.close()
            raise StateDirError(ledger.path, f"cannot be updated: {exc}") from exc
        except BaseException:
            ledger.close()
            raise
        self._locks_dir = directory / LOCKS_DIR
        self._ledger = ledger
        self._next_janitor = time.monotonic() + self.janitor_interval

    def _close_ledger(self) -> None:
        ledger, self._ledger = self._ledger, None
        try:
            if ledger is not None:
                with ledger.write() as conn:  # gone for the others now, not with the process
                    replica_stopped(conn, self.replica_id)
            if ledger is not None and self._open:
                # Ticks we claimed and never recorded (close without the engine's shutdown):
                # nobody else could tell that they ended while this process lives on.
                with ledger.write() as conn:
                    error = f"replica {self.replica_id} closed its backend first"
                    Ledger.abandon_ticks(conn, list(self._open), error)
        except sqlite3.Error as exc:
            logger.error("could not record the open ticks abandoned at close: %s", exc,
                         extra={"event": "lock_error", "replica": self.replica_id})  # fmt: skip
        finally:
            self._open.clear()
            for key in list(self._held):
                self._unlock(key)
            self._file_locks.clear()
            if ledger is not None:
                ledger.close()

    def _claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        ledger = self._require()
        self._maybe_janitor(ledger)
        unique, where = once_per_tick(requests)  # a tick asked for twice: the repeat is TAKEN
        # (job, tick) -> (run id, locked); run id None: LOCKED; locked None: no lock asked.
        won: dict[tuple[str, int], tuple[int | None, bool | None]] = {}
        taken: list[int] = []  # lock keys this call took
        exhausted: set[str] = set()  # jobs whose max_runs are used up
        held: set[tuple[str, int]] = set()  # ticks of paused jobs: recorded paused
        try:
            with ledger.write() as conn:
                inserted = []
                paused = paused_jobs(conn)  # in the claim's transaction: never a race
                for request in unique:
                    job, tick, limit = request.job, to_micros(request.scheduled_at), None
                    if request.max_runs is not None and not request.manual:
                        limit = request.max_runs
                    if limit is not None and Ledger.runs_reached(conn, job, limit):
                        exhausted.add(job)
                        continue
                    run_id = Ledger.insert_tick(conn, job, tick, request.manual, self._claimant)
                    if run_id is not None and job in paused and not request.manual:
                        Ledger.record(conn, job, tick, Outcome.PAUSED, None, None, _PAUSED)
                        won[job, tick] = (run_id, None)
                        held.add((job, tick))
                    elif run_id is not None:
                        inserted.append((job, tick, request.lock, run_id))
                tried: set[str] = set()
                # The lock goes to the earliest tick of a job; its other ticks are LOCKED.
                for job, tick, want_lock, run_id in sorted(inserted):
                    if not want_lock:
                        won[job, tick] = (run_id, None)
                        continue
                    if job in tried or not self._try_lock(job, run_id):
                        won[job, tick] = (None, False)
                    else:
                        taken.append(self.lock_key(job))
                        if Ledger.start_alone(conn, job, run_id):
                            won[job, tick] = (run_id, True)
                        else:
                            self._unlock(taken.pop())
                            won[job, tick] = (None, False)
                    tried.add(job)
                    if won[job, tick][1] is False:
                        # Refused: recorded at once (its claimant records it again), so that
                        # no claim meanwhile counts it as a run of the job (max_runs).
                        Ledger.record(
                            conn, job, tick, Outcome.SKIPPED_OVERLAP, None, None, _REFUSED
                        )
        except BaseException:
            for key in taken:
                self._unlock(key)
            raise
        self._open.update(won.keys() - held)
        answers = []
        for job, at, _, manual, limit in unique:
            run_id, locked = won.get((job, to_micros(at)), (None, None))
            if run_id is not None and (job, to_micros(at)) in held:
                answers.append(Claim(job, at, ClaimStatus.PAUSED, run_id, False, manual))
            elif run_id is not None:
                answers.append(Claim(job, at, ClaimStatus.CLAIMED, run_id, bool(locked), manual))
            elif limit is not None and not manual and job in exhausted:
                answers.append(Claim(job, at, ClaimStatus.EXHAUSTED, None, False))
            elif locked is None:
                answers.append(Claim(job, at, ClaimStatus.TAKEN, None, False, manual))
            else:
                answers.append(Claim(job, at, ClaimStatus.LOCKED, None, False, manual))
        return answer_each(requests, answers, where, taken_repeat)

    def _lock(self, claim: Claim) -> bool:
        ledger = self._require()
        if claim.run_id is None or not self._try_lock(claim.job, claim.run_id):
            return False
        try:
            with ledger.write() as conn:
                busy = not Ledger.start_alone(conn, claim.job, claim.run_id)
        except BaseException:
            self._unlock(self.lock_key(claim.job))
            raise
        if busy:
            self._unlock(self.lock_key(claim.job))
        return not busy

    def _release(self, releases: Sequence[Release]) -> None:
        if not releases:
            return
        ledger = self._require()
        with ledger.write() as conn:
            recorded = 0
            for record, _ in releases:
                recorded += Ledger.record(
                    conn,
                    record.job,
                    to_micros(record.scheduled_at),
                    record.outcome,
                    None if record.started_at is None else to_micros(record.started_at),
                    None if record.finished_at is None else to_micros(record.finished_at),
                    record.error,
                )
        # Unlock only after the outcome is committed: whoever takes the lock next must not
        # find this run still open. And only a lock this handle holds for this very run.
        for record, unlock in releases:
            self._open.discard((record.job, to_micros(record.scheduled_at)))
            key = self.lock_key(record.job)
            if unlock and record.run_id is not None and self._held.get(key) == record.run_id:
                self._unlock(key)
        if recorded != len(releases):
            logger.error(
                "%d of %d outcomes found no ledger row", len(releases) - recorded, len(releases),
                extra={"event": "lock_error", "replica": self.replica_id},
            )  # fmt: skip

    def _give_back(self, call: Future[_T], give_back: Callable[[_T], None]) -> None:
        if self._ledger is None or call.cancelled() or call.exception() is not None:
            return  # closed (close() let go of everything), or it took nothing
        try:
            give_back(call.result())
        except Exception:  # what is left open is recorded abandoned at close
            logger.exception(
                "could not let go of what a cancelled call took",
                extra={"event": "lock_error", "replica": self.replica_id},
            )

    def _give_back_claims(self, claims: list[Claim]) -> None:
        """The ticks a claim won for a caller that was cancelled: recorded missed (not run),
        and then their locks dropped."""
        won = [c for c in claims if c.status in (ClaimStatus.CLAIMED, ClaimStatus.LOCKED)]
        for claim in won:
            logger.warning(
                "job %r tick %s: its claim's caller was cancelled; recorded missed",
                claim.job, claim.scheduled_at.isoformat(),
                extra={"event": "missed", "job": claim.job,
                       "tick": claim.scheduled_at.isoformat(), "replica": self.replica_id},
            )  # fmt: skip
        self._release([Release(self._lost(claim), claim.locked) for claim in won])

    def _give_back_lock(self, claim: Claim, locked: bool) -> None:
        if locked:  # its run was never started: the tick is recorded missed, then unlocked
            self._release([Release(self._lost(claim), True)])

    def _lost(self, claim: Claim) -> RunRecord:
        error = "claimed, but its caller was cancelled before it heard; not run"
        return RunRecord(
            claim.job, claim.scheduled_at, Outcome.MISSED, self.replica_id, claim.run_id,
            None, None, error, claim.manual,
        )  # fmt: skip

    def _record_unclaimed(self, records: Sequence[RunRecord]) -> list[bool | None]:
        ledger = self._require()
        unique, where = once_per_tick(records)  # a record listed twice is recorded once
        answers: list[bool | None] = []
        with ledger.write() as conn:
            for record in unique:
                job, tick = record.job, to_micros(record.scheduled_at)
                limit = None if record.manual else record.max_runs
                if limit is not None and Ledger.runs_reached(conn, job, limit):
                    answers.append(False)  # the job has run its max_runs: no more ticks
                    continue
                answers.append(
                    Ledger.insert_finished(
                        conn, job, tick, record.outcome, record.error, self._claimant
                    )
                )
        return answer_each(records, answers, where, unrecorded_repeat)

    def clock_offset(self) -> timedelta | None:
        return None  # the processes share this host's clock

    def _last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        found = self._require().last_ticks(list(dict.fromkeys(jobs)))
        return {job: from_micros(tick) for job, tick in found.items()}

    # ---- locks -----------------------------------------------------------------------------

    def _try_lock(self, job: str, run_id: int) -> bool:
        """Take the job's file lock without waiting, unless a handle of this process has it."""
        import filelock  # on first use: importing it costs other backends' users ~30 ms

        key = self.lock_key(job)
        if key in self._held:
            return False
        path = str(self.lock_path(job))
        with _process_guard:
            if path in _process_held:
                return False
            _process_held.add(path)
        try:
            if key not in self._file_locks:
                lock = filelock.FileLock(path, timeout=0, thread_local=False)
                self._file_locks[key] = (lock, path)
            self._file_locks[key][0].acquire(timeout=0)
        except filelock.Timeout:
            self._forget(path)
            return False
        except BaseException:
            self._forget(path)
            raise
        self._held[key] = run_id
        return True

    def _unlock(self, key: int) -> None:
        self._held.pop(key, None)
        if key not in self._file_locks:
            return
        lock, path = self._file_locks[key]
        try:
            lock.release(force=True)
        finally:
            self._forget(path)

    @staticmethod
    def _forget(path: str) -> None:
        with _process_guard:
            _process_held.discard(path)

    # ---- housekeeping ----------------------------------------------------------------------

    def _require(self) -> Ledger:
        if self._ledger is None:
            raise ConfigurationError("the EmbeddedBackend is not open")
        return self._ledger

    def _maybe_janitor(self, ledger: Ledger) -> None:
        now = time.monotonic()
        if now < self._next_janitor:
            return
        self._next_janitor = now + self.janitor_interval
        try:
            self._janitor(ledger)
        except sqlite3.Error as exc:
            logger.warning("embedded backend housekeeping failed: %s", exc,
                           extra={"event": "lock_error", "replica": self.replica_id})  # fmt: skip

    def _janitor(self, ledger: Ledger) -> None:
        for run in ledger.abandon_dead():
            job, tick, replica = run.job, run.tick, run.replica
            logger.warning(
                "job %r tick %s: the process of replica %s died; recorded abandoned",
                job, from_micros(tick).isoformat(), replica,
                extra={"event": "abandoned", "job": job, "tick": from_micros(tick).isoformat(),
                       "replica": self.replica_id},
            )  # fmt: skip
        for _ in range(_PRUNE_BATCHES):  # a bounded number of short transactions
            if ledger.prune(self.retention, _PRUNE_BATCH) < _PRUNE_BATCH:
                break
        with ledger.write() as conn:
            prune_registry(conn, self.retention)


async def _complete(call: Future[_T]) -> _T:
    """Wait for a call that is not dropped when its caller is cancelled: the caller stops
    waiting, the call runs to its end (an error it ends with is logged there, unseen)."""
    waiter = asyncio.wrap_future(call)
    try:
        return await asyncio.shield(waiter)
    except asyncio.CancelledError:
        waiter.add_done_callback(_log_unseen)
        raise


def _log_unseen(waiter: asyncio.Future[Any]) -> None:
    if not waiter.cancelled() and waiter.exception() is not None:
        logger.error(
            "a call whose caller was cancelled failed", exc_info=waiter.exception(),
            extra={"event": "lock_error"},
        )  # fmt: skip
