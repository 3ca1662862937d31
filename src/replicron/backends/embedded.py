"""The embedded backend: several processes on one host coordinate through a state directory.

No server: gunicorn/uvicorn workers or a few daemons on one machine share ``state_dir``.

* **Once per tick**: a tick is claimed by inserting its unique ``(job, scheduled_at)`` row into
  the SQLite ledger ``state_dir/replicron.sqlite3`` (WAL) with ``ON CONFLICT DO NOTHING``; one
  transaction per batch of claims. Exactly one process's insert succeeds, whatever the timing.
* **No overlap**: a run holds the job's OS file lock ``state_dir/locks/<key>.lock`` (see
  :mod:`._file_locks`), which the kernel drops when the process dies. A run may start only if
  it gets the lock *and* no other started, unfinished run of the job belongs to a live process
  (a run whose lock was dropped may still be going).
* **Nothing left open**: rows record their claimant's pid; the open rows of a process that died
  are recorded ``abandoned`` when another process takes the job's lock, and by a janitor that
  runs at :meth:`~EmbeddedBackend.open` and every ``janitor_interval`` seconds during claims.
* **Nothing dropped**: an outcome that cannot be written (a full disk) is kept, and written
  before the next claim, start or outcome (or at close); its run's lock is dropped when the
  run ends all the same.

SQLite calls and file locks block: they run on a thread of the backend's own, one at a time
and in order, never on the caller's event loop (see :mod:`._call_thread`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from replicron.cluster import ClusterStatus, JobDefinition, Registration
from replicron.errors import ConfigurationError, StateDirError
from replicron.events import Outcome
from replicron.keys import LockKeyRegistry, job_lock_key

from . import base
from ._call_thread import CallThread
from ._claims import ClaimBatch
from ._file_locks import FileLocks
from ._janitor import Janitor
from ._leader_lock import LEADER_LOCK, LeaderCandidate
from ._ledger import Ledger
from ._micros import from_micros, to_micros
from ._processes import Claimant, process_start
from ._sqlite_cluster import SqliteCluster, join, leave, register_replica, replica_stopped
from ._state_dir import LEDGER_NAME, prepare_locks_dir, prepare_state_dir, problem_of
from .base import Claim, ClaimRequest, ClaimStatus, Release, RunRecord
from .leadership import Leader

__all__ = ["LEDGER_NAME", "LOCKS_DIR", "EmbeddedBackend"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

LOCKS_DIR = "locks"

_LOST = "claimed, but its caller was cancelled before it heard; not run"


class EmbeddedBackend:
    """Coordinates the processes of one host that share ``state_dir`` (created if missing).

    ``busy_timeout``: how long a write waits for another process's transaction (seconds).
    Finished rows older than ``retention`` are pruned, keeping each job's latest; the janitor
    (abandoning the open rows of dead processes, pruning) runs every ``janitor_interval``
    seconds, when claims are made.

    Its parts: the cluster's registry, pauses and status (:class:`SqliteCluster`) and its bid
    for the leader lease (:class:`LeaderCandidate`), both working through its thread and its
    open ledger.
    """

    #: Replicas in other processes claim from this backend too: a scheduler claims at an
    #: instant only what it can start promptly and leaves the rest to them.
    spreads_bursts = True
    #: Claims are refused before their tick: the replicas share the host's clock.
    claims_ahead: timedelta | None = None

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        retention: timedelta = timedelta(days=14),
        janitor_interval: float = 60.0,
        leader_retry: float = 1.0,
    ) -> None:
        if sys.platform == "win32":
            raise ConfigurationError("EmbeddedBackend needs a POSIX system (Linux, macOS, BSD)")
        if sqlite3.sqlite_version_info < (3, 30, 0):
            raise ConfigurationError(
                "EmbeddedBackend needs SQLite 3.30 or later;"
                f" this Python has {sqlite3.sqlite_version}"
            )
        if not busy_timeout > 0:
            raise ConfigurationError("busy_timeout must be positive")
        if not janitor_interval > 0:
            raise ConfigurationError("janitor_interval must be positive")
        if not leader_retry > 0:
            raise ConfigurationError("leader_retry must be positive")
        if retention <= timedelta(0):
            raise ConfigurationError("retention must be positive")
        self.state_dir = Path(state_dir)
        self.busy_timeout = busy_timeout
        self.retention = retention
        self.janitor_interval = janitor_interval
        self.replica_id = ""
        self._ledger: Ledger | None = None
        self._locks = FileLocks(self.state_dir / LOCKS_DIR)
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        self._keys = LockKeyRegistry(self.lock_key)
        self._open: set[tuple[str, int]] = set()  # (job, tick) of our claimed, unrecorded ticks
        self._unwritten: list[Release] = []  # outcomes whose write failed, oldest first
        self._claimant = Claimant("", os.getpid(), None)
        self._janitor = Janitor("", retention, janitor_interval)
        self._io: CallThread | None = None  # the thread every blocking call runs on
        self.leader_retry = leader_retry
        self._cluster = SqliteCluster(
            self.state_dir,
            busy_timeout,
            on_thread=self._call,
            ledger=self._require,
            replica=lambda: self.replica_id,
        )
        self._candidate = LeaderCandidate(
            self.state_dir / LEADER_LOCK,
            leader_retry,
            on_thread=self._call,
            ledger=self._require,
            replica=lambda: self.replica_id,
        )

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / LEDGER_NAME

    # ---- Backend protocol ----------------------------------------------------------------

    @property
    def peers(self) -> frozenset[str] | None:
        """Not known: other processes may share the state directory."""
        return None

    @property
    def refusal(self) -> str | None:
        """Never: replicas of one state directory always coordinate the same way."""
        return None

    async def join(self, since: datetime) -> None:
        await self._call(self._join, since)

    async def leave(self) -> dict[str, datetime] | None:
        """This replica claims no more: gone for the others at once; the replicas whose
        processes live on and are not stopping too."""
        return await self._call(self._leave)

    @property
    def connected(self) -> bool:
        """Whether the ledger is open."""
        return self._ledger is not None

    def register_job(self, name: str) -> None:
        self._keys.register(name)

    def unregister_job(self, name: str) -> None:
        self._keys.unregister(name)

    def lock_key(self, job: str) -> int:
        return job_lock_key(job)

    def lock_path(self, job: str) -> Path:
        """The job's lock file: its lock key as 16 hex digits."""
        return self._locks.path(self.lock_key(job))

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        if self._ledger is not None or self._io is not None:
            raise ConfigurationError("this EmbeddedBackend is open already")
        self._io = io = CallThread(replica_id)
        try:
            await self._call(self._open_ledger, replica_id, on_lock_lost)
        except BaseException:
            # Failed, or cancelled while the ledger was being opened (which goes on): whatever
            # was opened is closed behind it, and the thread ends once that is done.
            self._io = None
            io.end_behind(self._close_ledger)
            raise

    async def close(self) -> None:
        self._candidate.stop_seeking()
        io, self._io = self._io, None  # calls from now on are refused
        if io is not None:
            await io.end(self._close_ledger)  # behind the calls under way

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        return await self._call(self._claim, requests, give_back=self._give_back_claims)

    async def lock(self, claim: Claim) -> bool:
        return await self._call(
            self._lock, claim, give_back=lambda locked: self._give_back_lock(claim, locked)
        )

    async def release(self, releases: Sequence[Release]) -> None:
        if releases:
            await self._call(self._release, releases)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        return await self._call(self._record_unclaimed, records) if records else []

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        return await self._call(self._last_ticks, jobs) if jobs else {}

    async def last_finishes(self, jobs: Sequence[str]) -> dict[str, base.LastFinish]:
        return await self._call(self._last_finishes, jobs) if jobs else {}

    def clock_offset(self) -> timedelta | None:
        return None  # the processes share this host's clock

    async def _call(
        self, work: Callable[..., _T], *args: Any, give_back: Callable[[_T], None] | None = None
    ) -> _T:
        """``work(*args)`` on the backend's own thread (see :meth:`CallThread.call`)."""
        if self._io is None:
            raise ConfigurationError("the EmbeddedBackend is not open")
        return await self._io.call(work, *args, give_back=give_back)

    # ---- ClusterRegistry, RunRequests: the cluster part ----------------------------------

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Write the jobs this replica schedules (as changed; with ``complete``, all of them)
        to the registry; returns the registrations of its jobs by live replicas that define
        them differently."""
        return await self._cluster.announce(definitions, removed, complete)

    async def cluster_status(self) -> ClusterStatus:
        """The jobs, pauses and replicas of the state directory (a connection of its own:
        callable from any event loop, open or not)."""
        return await self._cluster.status()

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` for every replica of the state directory, from each one's next
        claim; False if it was paused already."""
        return await self._cluster.pause(job, by)

    async def resume(self, job: str) -> bool:
        """Resume ``job``; False if it was not paused."""
        return await self._cluster.resume(job)

    async def request_run(self, job: str, by: str) -> datetime:
        """Ask for one manual run of ``job`` by whichever replica sees it first (see
        :class:`~replicron.backends.base.RunRequests`)."""
        return await self._cluster.request_run(job, by)

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        """The manual runs asked for ``jobs`` not yet run, oldest first."""
        return await self._cluster.run_requests(jobs)

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """A job dropped from the code is expected no more: the registrations of replicas
        that are gone go. Returns their replicas, and the live ones that still schedule it."""
        return await self._cluster.forget(job)

    # ---- LeaderLease: the leader part ----------------------------------------------------

    def contend(self, on_change: Callable[[], None]) -> None:
        """Take the leader lease's lock file as soon as it is free (tried every
        ``leader_retry`` seconds) and hold it until the backend closes or its process ends."""
        self._candidate.contend(on_change)

    def leading(self) -> bool:
        return self._candidate.leading()

    @property
    def leader(self) -> Leader | None:
        return self._candidate.leader

    # ---- on the backend's thread ---------------------------------------------------------

    def _open_ledger(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None
    ) -> None:
        self.replica_id = replica_id
        if on_lock_lost is not None:  # never called: a file lock is only lost with its process
            self._on_lock_lost = on_lock_lost
        pid = os.getpid()
        self._claimant = Claimant(replica_id, pid, process_start(pid))
        self._janitor = Janitor(replica_id, self.retention, self.janitor_interval)
        directory = prepare_state_dir(self.state_dir)
        ledger = Ledger(directory / LEDGER_NAME, self.busy_timeout)
        try:
            prepare_locks_dir(directory / LOCKS_DIR)
            self._janitor.run(ledger)
            with ledger.write() as conn:
                register_replica(conn, self._claimant)
        except sqlite3.Error as exc:
            ledger.close()
            problem = problem_of(exc, directory)
            raise StateDirError(ledger.path, f"cannot be updated: {problem}") from exc
        except BaseException:
            ledger.close()
            raise
        self._locks = FileLocks(directory / LOCKS_DIR)
        self._ledger = ledger
        self._janitor.restart()

    def _join(self, since: datetime) -> None:
        with self._require().write() as conn:
            join(conn, self.replica_id, since)

    def _leave(self) -> dict[str, datetime] | None:
        self._candidate.resign()
        return None if self._ledger is None else leave(self._ledger, self.replica_id)

    def _close_ledger(self) -> None:
        if self._ledger is not None:
            self._write_unwritten()
        ledger, self._ledger = self._ledger, None
        try:
            for record, _ in self._unwritten:
                logger.error(
                    "job %r tick %s: could not record %s (run %s): the ledger cannot be written;"
                    " its row stays open, and is recorded abandoned once this process ends",
                    record.job,
                    record.scheduled_at.isoformat(),
                    record.outcome.value,
                    record.run_id,
                    extra=_extra(record, self.replica_id),
                )
            if ledger is not None:
                with ledger.write() as conn:  # gone for the others now, not with the process
                    replica_stopped(conn, self.replica_id)
            unrecorded = self._open - {_tick_of(record) for record, _ in self._unwritten}
            if ledger is not None and unrecorded:
                # Ticks we claimed and never recorded (close without the engine's shutdown):
                # nobody else could tell that they ended while this process lives on.
                with ledger.write() as conn:
                    error = f"replica {self.replica_id} closed its backend first"
                    Ledger.abandon_ticks(conn, list(unrecorded), error)
        except sqlite3.Error as exc:
            logger.error(
                "could not record the open ticks abandoned at close: %s",
                exc,
                extra={"event": "lock_error", "replica": self.replica_id},
            )
        finally:
            self._open.clear()
            self._unwritten = []
            self._locks.unlock_all()
            self._candidate.resign()
            if ledger is not None:
                ledger.close()

    def _claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        ledger = self._require()
        self._write_unwritten()
        self._janitor.run_when_due(ledger)
        unique, where = base.once_per_tick(requests)  # a repeated tick: the repeat is TAKEN
        batch = ClaimBatch(self._claimant, self._locks, self.lock_key, self._ended_runs())
        try:
            with ledger.write() as conn:
                batch.write(conn, unique)
        except BaseException:
            batch.let_go()
            raise
        self._open.update(batch.opened())
        answers = [batch.answer(request) for request in unique]
        return base.answer_each(requests, answers, where, base.taken_repeat)

    def _lock(self, claim: Claim) -> bool:
        ledger = self._require()
        key = self.lock_key(claim.job)
        if claim.run_id is None or not self._locks.try_lock(key, claim.run_id):
            return False
        try:
            self._write_unwritten()
            with ledger.write() as conn:
                started = Ledger.start_alone(conn, claim.job, claim.run_id, self._ended_runs())
        except BaseException:
            self._locks.unlock(key)
            raise
        if not started:
            self._locks.unlock(key)
        return started

    def _release(self, releases: Sequence[Release]) -> None:
        """Record the outcomes, with those that wait from before; one that cannot be written
        now is kept for the next write. Each run's lock is dropped either way: the run ended."""
        waited = len(self._unwritten)
        batch = self._unwritten + list(releases)
        if not batch:
            return
        ledger = self._require()
        try:
            with ledger.write() as conn:
                recorded = 0
                for record, _ in batch:
                    recorded += Ledger.record(
                        conn,
                        record.job,
                        to_micros(record.scheduled_at),
                        record.outcome,
                        _micros(record.started_at),
                        _micros(record.finished_at),
                        record.error,
                    )
        except sqlite3.OperationalError as exc:  # the disk or another writer, not the rows
            self._unwritten = batch
            if not waited:
                logger.warning(
                    "outcomes waiting to be written: %d (%s); each claim retries them",
                    len(batch),
                    problem_of(exc, self.state_dir),
                    extra={"event": "lock_error", "replica": self.replica_id},
                )
        else:
            self._unwritten = []
            if waited:
                logger.info(
                    "outcomes that waited are written: %d",
                    waited,
                    extra={"event": "lock_error", "replica": self.replica_id},
                )
            for record, _ in batch:
                self._open.discard(_tick_of(record))
            if recorded != len(batch):
                logger.error(
                    "%d of %d outcomes found no ledger row",
                    len(batch) - recorded,
                    len(batch),
                    extra={"event": "lock_error", "replica": self.replica_id},
                )
        # Unlocked once the outcome is committed, or kept: whoever takes the lock next finds
        # this run open only while its outcome waits (this process knows it ended). And only
        # a lock this handle holds for this very run.
        for record, unlock in releases:
            key = self.lock_key(record.job)
            if unlock and record.run_id is not None and self._locks.holder(key) == record.run_id:
                self._locks.unlock(key)

    def _ended_runs(self) -> set[int]:
        """Our runs whose outcome waits: ended, though their rows look open to the others."""
        return {r.record.run_id for r in self._unwritten if r.record.run_id is not None}

    def _write_unwritten(self) -> None:
        """Write the outcomes that wait, if the ledger takes them now."""
        if self._unwritten:
            self._release([])

    def _give_back_claims(self, claims: list[Claim]) -> None:
        """The ticks a claim won for a caller that was cancelled: recorded missed (not run),
        and then their locks dropped."""
        won = [c for c in claims if c.status in (ClaimStatus.CLAIMED, ClaimStatus.LOCKED)]
        for claim in won:
            logger.warning(
                "job %r tick %s: its claim's caller was cancelled; recorded missed",
                claim.job,
                claim.scheduled_at.isoformat(),
                extra={
                    "event": "missed",
                    "job": claim.job,
                    "tick": claim.scheduled_at.isoformat(),
                    "replica": self.replica_id,
                },
            )
        self._release([Release(self._lost(claim), claim.locked) for claim in won])

    def _give_back_lock(self, claim: Claim, locked: bool) -> None:
        if locked:  # its run was never started: the tick is recorded missed, then unlocked
            self._release([Release(self._lost(claim), True)])

    def _lost(self, claim: Claim) -> RunRecord:
        return RunRecord(
            claim.job,
            claim.scheduled_at,
            Outcome.MISSED,
            self.replica_id,
            claim.run_id,
            None,
            None,
            _LOST,
            claim.manual,
        )

    def _record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        ledger = self._require()
        unique, where = base.once_per_tick(records)  # a record listed twice is recorded once
        answers: list[int | None] = []
        with ledger.write() as conn:
            for record in unique:
                job, tick = record.job, to_micros(record.scheduled_at)
                limit = None if record.manual else record.max_runs
                if limit is not None and Ledger.runs_reached(conn, job, limit):
                    last_run = Ledger.last_run(conn, job)
                    if last_run is None or tick > last_run:
                        answers.append(False)  # after its last run, the job has no more ticks
                        continue
                if record.through is not None:
                    span = (tick, to_micros(record.through), record.ticks)
                    starts = [to_micros(start) for start in record.starts] or [tick]
                    written = Ledger.insert_missed_range(
                        conn, job, span, starts, record.error, self._claimant
                    )
                    answers.append(False if written is None else written)
                    continue
                answers.append(
                    Ledger.insert_finished(
                        conn, job, tick, record.outcome, record.error, self._claimant
                    )
                )
        return base.answer_each(records, answers, where, base.unrecorded_repeat)

    def _last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        found = self._require().last_ticks(list(dict.fromkeys(jobs)))
        return {job: from_micros(tick) for job, tick in found.items()}

    def _last_finishes(self, jobs: Sequence[str]) -> dict[str, base.LastFinish]:
        found = self._require().last_finishes(list(dict.fromkeys(jobs)))
        return {
            job: base.LastFinish(
                from_micros(tick),
                None if finished is None else from_micros(finished),
                None if outcome is None else Outcome(outcome),
            )
            for job, (tick, finished, outcome) in found.items()
        }

    def _require(self) -> Ledger:
        if self._ledger is None:
            raise ConfigurationError("the EmbeddedBackend is not open")
        return self._ledger


def _micros(instant: datetime | None) -> int | None:
    return None if instant is None else to_micros(instant)


def _tick_of(record: RunRecord) -> tuple[str, int]:
    return record.job, to_micros(record.scheduled_at)


def _extra(record: RunRecord, replica: str) -> dict[str, str]:
    tick = record.scheduled_at.isoformat()
    return {"event": "lock_error", "job": record.job, "tick": tick, "replica": replica}
