"""The PostgreSQL backend: every tick exactly once across replicas, no overlap, no leaked lock.

* A tick is claimed by inserting its unique ``(namespace, job, scheduled_at)`` row with
  ``ON CONFLICT DO NOTHING``: exactly one replica's insert succeeds, whatever the clocks say,
  and never before the tick is due by the database's clock.
* No overlap: the job's session advisory lock is held for the run, and a run may start only if
  no other open run of the job is still heartbeating (a run whose replica lost its lock may
  still be going; the lock alone cannot see it). The replica stops its own runs when its lease
  runs out, before their rows go stale for the others (``_lease``).
* All of it on one lock session per replica; claims of one instant go in one round trip,
  the outcome and the unlock in one more. A statement that failed with its session is retried
  once on a new one; outcomes that could not be written are kept and written later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from replicron.backends.base import (
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
from replicron.errors import ConfigurationError, LockKeyCollisionError
from replicron.keys import LockKeyRegistry, job_lock_key

from ._cluster import ClusterMethods, read_namespaces
from ._lease import Lease
from ._offset import OffsetEstimator
from ._session import BackendUnavailableError, LockSession, TransactionPoolerError
from ._sources import ConnectionSource, conninfo_of
from ._sql import queries
from ._status import JobStatus, ReplicaStatus, job_status, replica_status
from ._tokens import ClaimTokens
from ._writes import log_unwritten, log_write
from .migrate import migrate_session

__all__ = ["JobStatus", "LockKeyCollisionError", "PostgresBackend", "ReplicaStatus"]

logger = logging.getLogger(__name__)

#: How far ahead of the database's clock a tick may be claimed: room for the error of the
#: measured offset, far less than any tick spacing.
CLAIM_AHEAD = timedelta(milliseconds=250)
#: A replica whose clock is off the database's by more than this is warned about.
OFFSET_WARNING = 1.0
_STATUS = {
    "claimed": ClaimStatus.CLAIMED,
    "locked_claimed": ClaimStatus.CLAIMED,
    "taken": ClaimStatus.TAKEN,
    "locked": ClaimStatus.LOCKED,
    "early": ClaimStatus.EARLY,
    "exhausted": ClaimStatus.EXHAUSTED,
    "paused": ClaimStatus.PAUSED,
}


class PostgresBackend(ClusterMethods):
    """Coordinates replicas through one PostgreSQL database.

    ``namespace`` separates independent deployments sharing a database (lock keys are
    ``job_lock_key(namespace + name)``: end it with a separator such as ``"billing/"``).
    Open ticks heartbeat every ``heartbeat_interval`` seconds; a run whose heartbeat is older
    than ``stale_after`` (default three intervals) counts as dead for the other replicas, and
    this replica stops its own runs ``heartbeat_interval`` before that (its lease) unless a
    heartbeat got through meanwhile. Every statement has a deadline (``statement_timeout``,
    default half the lease). ``fence_stale_holders`` lets a replica terminate the server
    session of a frozen replica that holds a job's lock with a stale heartbeat. Finished rows
    older than ``retention`` are pruned, keeping each job's latest.
    """

    #: Replicas in other processes claim from this backend too: a scheduler claims at an
    #: instant only what it can start promptly and leaves the rest to them.
    spreads_bursts = True
    #: How long before a tick a scheduler may claim it (it claims by about twice its recent
    #: claims' round trips, and starts the run on time): well inside ``CLAIM_AHEAD``, which
    #: leaves room for the error of the measured clock offset.
    claims_ahead = timedelta(milliseconds=100)

    def __init__(
        self,
        conninfo: ConnectionSource,
        *,
        namespace: str = "",
        migrate: bool = True,
        heartbeat_interval: float = 5.0,
        stale_after: float | None = None,
        statement_timeout: float | None = None,
        fence_stale_holders: bool = False,
        session_pooler: bool = False,
        retention: timedelta = timedelta(days=14),
        connect_timeout: float = 10.0,
    ) -> None:
        if heartbeat_interval <= 0:
            raise ConfigurationError("heartbeat_interval must be positive")
        self.conninfo = conninfo_of(conninfo)
        self.namespace = namespace
        self.migrate = migrate
        self.heartbeat_interval = heartbeat_interval
        self.stale_after = 3 * heartbeat_interval if stale_after is None else stale_after
        if self.stale_after <= heartbeat_interval:
            raise ConfigurationError("stale_after must be longer than heartbeat_interval")
        #: How long after its last proof of life this replica lets its runs go on.
        self.lease = self.stale_after - heartbeat_interval
        self.statement_timeout = self.lease / 2 if statement_timeout is None else statement_timeout
        if not 0 < self.statement_timeout < self.lease:
            raise ConfigurationError(
                f"statement_timeout must be positive and shorter than the lease "
                f"(stale_after - heartbeat_interval = {self.lease:g} s)"
            )
        self.fence_stale_holders = fence_stale_holders
        self.session_pooler = session_pooler
        self._refusal: TransactionPoolerError | None = None  # a pooler showed itself: for good
        self.retention = retention
        self.connect_timeout = connect_timeout
        self.replica_id = ""
        self._session: LockSession | None = None
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        self._keys = LockKeyRegistry(self.lock_key)
        self._held: dict[int, int] = {}  # lock key -> run id holding it on this session
        self._open: set[int] = set()  # run ids of our claimed, unfinished ticks
        #: The replicas of the namespace seen by the last heartbeat, this one among them: a
        #: scheduler spreads a burst over them (see ``_engine.capacity``).
        self.peers: frozenset[str] = frozenset()
        self._unwritten: list[Release] = []  # outcomes whose write failed, oldest first
        self._tokens = ClaimTokens()  # of ticks whose claim (or miss record) failed
        self._lease: Lease | None = None
        self._offsets = OffsetEstimator()
        self._offset_warned = False
        self._housekeeper: asyncio.Task[None] | None = None
        self._q = queries()

    # ---- Backend protocol ----------------------------------------------------------------

    def register_job(self, name: str) -> None:
        self._keys.register(name)

    def unregister_job(self, name: str) -> None:
        self._keys.unregister(name)

    @property
    def connected(self) -> bool:
        """Whether the lock session is open and usable (for readiness probes)."""
        return self._session is not None and self._session.connected

    def lock_key(self, job: str) -> int:
        return job_lock_key(self.namespace + job)

    def clock_offset(self) -> timedelta | None:
        """How far the database's clock is ahead of this replica's (best recent sample)."""
        return self._offsets.current  # from any thread: one reference, set by the loop

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        self.replica_id = replica_id
        if on_lock_lost is not None:
            self._on_lock_lost = on_lock_lost
        self._lease = Lease(self.lease, self._lease_expired)
        self._session = LockSession(
            self.conninfo,
            application_name=f"replicron {replica_id}"[:63],
            connect_timeout=self.connect_timeout,
            statement_deadline=self.statement_timeout,
            drop_after=self.stale_after,
            on_lost=self._session_lost,
            session_pooler=self.session_pooler,
        )
        await self._session.connect()
        if self.migrate:
            await migrate_session(self._session)
        for _ in range(3):  # the offset is needed before the first tick is planned
            await self._sample_clock()
        await self._heartbeat()  # seen by the other replicas, and seeing them, from the start
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeep())

    async def close(self) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeper
            self._housekeeper = None
        if (self._unwritten or self._tokens) and not self._unreachable():
            with contextlib.suppress(Exception):  # one last try, bounded: shutdown goes on
                await asyncio.wait_for(self._last_writes(), self.statement_timeout)
        if self._session is not None and not self._unreachable():
            with contextlib.suppress(Exception):  # bounded, and shutdown goes on regardless
                await asyncio.wait_for(
                    self._fetch("replica_stopped", replica=self.replica_id),
                    self.statement_timeout,
                )
        for release in self._unwritten:
            log_unwritten(release.record, self.replica_id)
        self._unwritten.clear()
        if self._session is not None:
            await self._session.close()
        if self._lease is not None:
            self._lease.clear()
        self._held.clear()

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        unique, where = once_per_tick(requests)  # a tick asked for twice: the repeat is TAKEN
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        rows = await self._fetch_remembering(
            ticks,
            "claim",
            retry=True,  # the token makes a retry recognise the rows its first try inserted
            jobs=[r.job for r in unique],
            ticks=[r.scheduled_at for r in unique],
            keys=[self.lock_key(r.job) for r in unique],
            locks=[r.lock for r in unique],
            manual=[r.manual for r in unique],
            limits=[r.max_runs for r in unique],
            replica=self.replica_id,
            tokens=self._tokens.for_ticks(ticks),
            ahead=CLAIM_AHEAD,
            stale_after=timedelta(seconds=self.stale_after),
        )  # fmt: skip
        sent = self._sent_at()
        won: dict[tuple[str, datetime], tuple[Any, ...]] = {}
        for job, tick, run_id, status, blocker, stale, holder in rows:
            if status == "moved":
                await self._moved()
            won[(job, tick.astimezone(UTC))] = (run_id, status, blocker, stale, holder)
        answers = []
        for request, key in zip(unique, ticks, strict=True):
            job, tick = request.job, request.scheduled_at
            answer = won.get(key)
            if answer is None:  # no row came back for it: somebody has it
                answers.append(taken_repeat(request))
                continue
            run_id, status, blocker, stale, holder = answer
            if status == "locked":  # its row is recorded skipped_overlap at once, by tick
                if stale and holder is not None:
                    await self._blocked_by_frozen(job, blocker, holder)
                answers.append(Claim(job, tick, ClaimStatus.LOCKED, None, False, request.manual))
                continue
            if run_id is not None and status != "paused":  # a paused tick is closed already
                self._open.add(run_id)
            if status == "locked_claimed":
                self._held[self.lock_key(job)] = run_id
                assert self._lease is not None
                self._lease.start(run_id, sent)
            locked = status == "locked_claimed"
            answers.append(Claim(job, tick, _STATUS[status], run_id, locked, request.manual))
        return answer_each(requests, answers, where, taken_repeat)

    async def lock(self, claim: Claim) -> bool:
        key = self.lock_key(claim.job)
        if key in self._held:  # the session would take it again: it re-enters its locks
            return False
        [(locked,)] = await self._fetch(
            "lock",
            key=key,
            job=claim.job,
            run_id=claim.run_id,
            stale_after=timedelta(seconds=self.stale_after),
        )
        if locked is None:
            await self._moved()
        if locked:
            assert claim.run_id is not None
            assert self._lease is not None
            self._held[key] = claim.run_id
            self._lease.start(claim.run_id, self._sent_at())
        return bool(locked)

    async def release(self, releases: Sequence[Release]) -> None:
        """Record the outcomes (and drop the locks); an outcome that cannot be written now is
        kept and written with the next release or heartbeat, on a new session if need be."""
        ended = [r.record.run_id for r in releases if r.record.run_id is not None]
        # A finished run stops counting as running here at once: never heartbeated again.
        self._open.difference_update(ended)
        assert self._lease is not None
        self._lease.end(ended)
        if self._unreachable():
            # The server could not be reached a moment ago: the housekeeper writes these with
            # its next heartbeat, so a shutdown never waits on one more failing reconnect.
            self._unwritten += [Release(release.record, False) for release in releases]
            return
        try:
            await self._write_outcomes(releases)
        except BackendUnavailableError as exc:
            logger.warning(
                "%d outcomes wait to be written (%s); retrying on a new session",
                len(self._unwritten), exc, extra={"event": "lock_error",
                                                  "replica": self.replica_id},
            )  # fmt: skip

    async def _write_outcomes(self, releases: Sequence[Release]) -> None:
        unlock_keys, unlocking = [], []
        batch = self._unwritten + list(releases)
        self._unwritten = []
        for record, unlock in batch:
            key = self.lock_key(record.job)
            # Unlock only a lock this session still holds for this run: after a lost session
            # the lock is gone, and another replica may hold the key now.
            if unlock and self._held.get(key, -1) == record.run_id:
                del self._held[key]
                unlock_keys.append(key)
                unlocking.append(record)
        records = [release.record for release in batch]
        assert self._session is not None
        generation = self._session.generation
        try:
            [(written, found, unlocked)] = await self._fetch(
                "release",
                retry=True,  # written by run id, never over another outcome: idempotent
                run_ids=[r.run_id for r in records],
                jobs=[r.job for r in records],
                ticks=[r.scheduled_at for r in records],
                outcomes=[r.outcome.value for r in records],
                started=[r.started_at for r in records],
                finished=[r.finished_at for r in records],
                errors=[r.error for r in records],
                replica=self.replica_id,
                unlock_keys=unlock_keys,
            )
        except (BackendUnavailableError, asyncio.CancelledError):  # nothing known written
            kept = self._session.connected and self._session.generation == generation
            if kept:  # the session lives on (the statement was rolled back): so do its locks
                for key, record in zip(unlock_keys, unlocking, strict=True):
                    self._held[key] = record.run_id  # type: ignore[assignment]
            self._unwritten = [
                Release(record, kept and record in unlocking) for record in records
            ] + self._unwritten
            raise
        if self._session.generation != generation:
            unlocked = []  # retried on a new session: the locks had died with the old one
        elif None in unlocked:
            await self._moved()
        for record, key, released in zip(unlocking, unlock_keys, unlocked, strict=False):
            if released is False:
                logger.error(
                    "job %r: advisory lock %s was not held at unlock", record.job, key,
                    extra={"event": "lock_error", "job": record.job, "replica": self.replica_id},
                )  # fmt: skip
        for record, ok, before in zip(records, written, found, strict=True):
            log_write(record, ok, before, self.replica_id)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[bool | None]:
        unique, where = once_per_tick(records)  # a record listed twice is recorded once
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        rows = await self._fetch_remembering(
            ticks,
            "record_unclaimed",
            retry=True,  # the token recognises what a first try recorded
            jobs=[r.job for r in unique],
            ticks=[r.scheduled_at for r in unique],
            outcomes=[r.outcome.value for r in unique],
            errors=[r.error for r in unique],
            tokens=self._tokens.for_ticks(ticks),
            limits=[None if r.manual else r.max_runs for r in unique],
            replica=self.replica_id,
            ahead=CLAIM_AHEAD,
        )  # fmt: skip
        found = {(job, tick.astimezone(UTC)): what for job, tick, what in rows}
        # Per tick: "recorded", "early" (not yet due by the database's clock, ask again), or
        # something else or nothing (somebody has it): not recorded.
        answers: list[bool | None] = [
            None if (what := found.get(key)) == "early" else what == "recorded" for key in ticks
        ]
        return answer_each(records, answers, where, unrecorded_repeat)

    async def _fetch_remembering(
        self, remembered: list[tuple[str, datetime]], name: str, **params: Any
    ) -> list[Any]:
        """Run a tick-writing statement; if it fails, remember each tick's token for the next
        try (the failed one may have written rows); once it answers, forget them."""
        try:
            rows = await self._fetch(name, **params)
        except BackendUnavailableError:
            self._tokens.remember(remembered, params["tokens"])
            raise
        self._tokens.forget(remembered)
        return rows

    async def _last_writes(self) -> None:
        if self._unwritten:
            await self._write_outcomes([])
        if self._tokens:  # else a janitor records their rows abandoned
            await self._close_lost_claims()

    async def _close_lost_claims(self) -> None:
        rows = await self._fetch(
            "close_lost_claims",
            tokens=self._tokens.tokens(),
            jobs=self._tokens.jobs(),
        )
        for job, tick in rows:
            logger.warning(
                "job %r tick %s: its claim's answer was lost; recorded missed", job,
                tick.isoformat(), extra={"event": "missed", "job": job,
                                         "tick": tick.isoformat(), "replica": self.replica_id},
            )  # fmt: skip
        self._tokens.clear()

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        rows = await self._fetch("last_ticks", retry=True, jobs=list(jobs))
        return {job: tick.astimezone(UTC) for job, tick in rows}

    # ---- status and housekeeping ---------------------------------------------------------

    async def status(self) -> list[JobStatus]:
        rows = await self._fetch("status", stale_after=timedelta(seconds=self.stale_after))
        return [job_status(row) for row in rows]

    async def namespaces(self) -> dict[str, int]:
        """Every namespace with recorded runs in this database, and its number of rows."""
        return await read_namespaces(self.conninfo, self.connect_timeout)

    async def replicas(self) -> list[ReplicaStatus]:
        rows = await self._fetch("replicas", stale_after=timedelta(seconds=self.stale_after))
        return [replica_status(row) for row in rows]

    async def _housekeep(self) -> None:
        """Heartbeat (open ticks, our locks, the clock offset, unwritten outcomes); now and
        then, abandon the open ticks of dead replicas and prune old rows."""
        beats = 0
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            beats += 1
            try:
                await self._heartbeat()
                if self._unwritten:
                    await self._write_outcomes([])
                if beats % 12 == 1:
                    await self._janitor()
            except BackendUnavailableError as exc:
                logger.warning("heartbeat failed: %s", exc, extra={"event": "lock_error"})
            except Exception:
                logger.exception("housekeeping failed", extra={"event": "lock_error"})

    async def _heartbeat(self) -> None:
        offset = self._offsets.current
        open_runs = sorted(self._open)
        [(ours, db_now, refreshed, held, peers)] = await self._fetch(
            "heartbeat",
            run_ids=open_runs,
            replica=self.replica_id,
            offset_ms=None if offset is None else offset.total_seconds() * 1000,
            stale_after=timedelta(seconds=self.stale_after),
        )
        self.peers = frozenset(peers) | {self.replica_id}
        if not ours:
            await self._moved()
        self._clock_sample(db_now)
        assert self._lease is not None
        self._lease.renew(refreshed, self._sent_at())
        # An open run the heartbeat did not refresh was recorded by someone else meanwhile
        # (a janitor that took it for dead): it must stop.
        gone = set(open_runs) - set(refreshed) & self._open
        present = {(k - (1 << 64)) if k >= 1 << 63 else k for k in held}
        lost = [run for key, run in self._held.items() if key not in present or run in gone]
        if lost:
            self._forget_locks(lost)
            self._lose(lost)

    async def _sample_clock(self) -> None:
        [(_, db_now)] = await self._fetch("clock_sample")
        self._clock_sample(db_now)

    def _clock_sample(self, db_now: datetime) -> None:
        assert self._session is not None
        assert self._session.last_round_trip is not None
        self._offsets.add(db_now, *self._session.last_round_trip)
        ahead = -self._offsets.current.total_seconds() if self._offsets.current else 0.0
        off = abs(ahead) > OFFSET_WARNING
        if off and not self._offset_warned:
            logger.warning(
                "this replica's clock is %+.3f s off the database's; replicron schedules on "
                "the database's clock, but fix the host's time synchronisation", ahead,
                extra={"event": "clock_offset", "replica": self.replica_id},
            )  # fmt: skip
        self._offset_warned = off

    async def _janitor(self) -> None:
        stale = await self._fetch(
            "abandon_stale", retry=True, stale_after=timedelta(seconds=self.stale_after)
        )
        for job, tick, replica in stale:
            logger.warning(
                "job %r tick %s: replica %s stopped heartbeating; recorded abandoned",
                job, tick.isoformat(), replica,
                extra={"event": "abandoned", "job": job, "tick": tick.isoformat(),
                       "replica": self.replica_id},
            )  # fmt: skip
        await self._fetch("prune", retention=self.retention, batch=1000)
        await self._fetch("prune_registry", retention=self.retention)

    async def _blocked_by_frozen(self, job: str, replica: str | None, pid: int) -> None:
        """The job's lock is held by a session whose run stopped heartbeating: its replica is
        frozen (or cut off in a way its server session does not notice)."""
        fence = " (fencing it)" if self.fence_stale_holders else ""
        logger.warning(
            "job %r is blocked by replica %s: its heartbeat is stale but its server session "
            "%s still holds the job's lock%s", job, replica, pid, fence,
            extra={"event": "blocked", "job": job, "replica": self.replica_id},
        )  # fmt: skip
        if self.fence_stale_holders:
            with contextlib.suppress(BackendUnavailableError):
                await self._fetch(
                    "fence_stale_holder", job=job, replica=self.replica_id,
                    stale_after=timedelta(seconds=self.stale_after),
                )  # fmt: skip

    # ---- losing the session or the lease -------------------------------------------------

    def _session_lost(self) -> None:
        lost = list(self._held.values())
        self._held.clear()
        if self._lease is not None:
            self._lease.clear()
        if lost:
            self._lose(lost)

    def _lease_expired(self, run_ids: list[int]) -> None:
        logger.error(
            "no heartbeat got through for %.1f s: stopping runs %s before other replicas may "
            "take their jobs over", self.lease, run_ids,
            extra={"event": "lock_lost", "replica": self.replica_id},
        )  # fmt: skip
        self._forget_locks(run_ids)
        self._on_lock_lost(run_ids)
        if self._session is not None:
            self._session.invalidate()  # their locks must not outlive them (nor the others')

    def _forget_locks(self, run_ids: list[int]) -> None:
        """These runs' locks are gone (or about to be): this session unlocks none of them."""
        ended = set(run_ids)
        for key in [key for key, run in self._held.items() if run in ended]:
            del self._held[key]

    def _lose(self, run_ids: list[int]) -> None:
        logger.error(
            "lost the advisory locks of runs %s", run_ids,
            extra={"event": "lock_lost", "replica": self.replica_id},
        )  # fmt: skip
        if self._lease is not None:
            self._lease.end(run_ids)
        self._on_lock_lost(run_ids)

    async def _moved(self) -> None:
        """A statement ran on another server session than the lock session's: a transaction
        pooler is in between. Nothing was locked or unlocked there; the session is given up,
        and every later statement is refused: coordination through it cannot be trusted."""
        if self._session is not None:
            self._session.invalidate()
        self._refusal = TransactionPoolerError(
            "a statement of the lock session ran on another server session: the connection "
            "goes through a transaction pooler, where session advisory locks do not hold; "
            "this replica coordinates nothing more. Connect it directly to PostgreSQL."
        )
        logger.error("%s", self._refusal, extra={"event": "lock_error", "replica": self.replica_id})
        raise self._refusal

    def _unreachable(self) -> bool:
        session = self._session
        if session is None:
            return True
        failed = session.connect_failed_at
        return failed is not None and time.monotonic() - failed < self.heartbeat_interval

    def _sent_at(self) -> float:
        assert self._session is not None
        assert self._session.last_round_trip is not None
        return self._session.last_round_trip.sent_mono

    async def _fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        if self._refusal is not None:
            raise self._refusal
        if self._session is None:
            raise BackendUnavailableError("the backend is not open")
        params.setdefault("namespace", self.namespace)
        return await self._session.fetch(self._q[name], params, retry=retry)
