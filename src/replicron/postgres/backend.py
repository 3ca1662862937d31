"""The PostgreSQL backend: every tick exactly once across replicas, no overlap, no leaked lock.

* A tick is claimed by inserting its unique ``(namespace, job, scheduled_at)`` row with
  ``ON CONFLICT DO NOTHING``: exactly one replica's insert succeeds, whatever the clocks say,
  and never before the tick is due by the database's clock.
* No overlap: the job's session advisory lock is held for the run, and a run may start only if
  no other open run of the job is still heartbeating (a run whose replica lost its lock may
  still be going; the lock alone cannot see it). The replica stops its own runs when its lease
  runs out, before their rows go stale for the others (``_lease``, ``_runs``).
* The heartbeat, the clock offset, the janitor and what follows a lost session or lease are
  the housekeeper's (``_housekeeping``); what advisory locks add to that, ``_advisory``.
* All of it on one lock session per replica; claims of one instant go in one round trip,
  the outcome and the unlock in one more. A statement that failed with its session is retried
  once on a new one; outcomes that could not be written are kept and written later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from replicron.backends.base import (
    Claim,
    ClaimRequest,
    Release,
    RunRecord,
    answer_each,
    once_per_tick,
    taken_repeat,
    unrecorded_repeat,
)
from replicron.errors import ConfigurationError, LockKeyCollisionError
from replicron.keys import LockKeyRegistry, job_lock_key

from ._advisory import refuse_pooler, report_unheld
from ._claims import ClaimRow
from ._cluster import ClusterMethods, read_namespaces
from ._housekeeping import Housekeeper
from ._session import BackendUnavailableError, LockSession
from ._sources import ConnectionSource, conninfo_of
from ._statements import Statements
from ._status import JobStatus, ReplicaStatus, job_status, replica_status
from ._tokens import ClaimTokens
from ._writes import log_unwritten, log_write
from .migrate import migrate_session

__all__ = ["JobStatus", "LockKeyCollisionError", "PostgresBackend", "ReplicaStatus"]

logger = logging.getLogger(__name__)

#: How far ahead of the database's clock a tick may be claimed: room for the error of the
#: measured offset, far less than any tick spacing.
CLAIM_AHEAD = timedelta(milliseconds=250)


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
        self.retention = retention
        self.connect_timeout = connect_timeout
        self.replica_id = ""
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        self._keys = LockKeyRegistry(self.lock_key)
        self._unwritten: list[Release] = []  # outcomes whose write failed, oldest first
        self._tokens = ClaimTokens()  # of ticks whose claim (or miss record) failed
        self._statements = Statements(namespace)  # on the lock session, once open
        self._housekeeper = Housekeeper(
            self._statements,
            heartbeat_interval=heartbeat_interval,
            stale_after=self.stale_after,
            lease=self.lease,
            retention=retention,
            fence_stale_holders=fence_stale_holders,
            write_pending=self._write_pending,
        )
        # Claimed, locked and finished here; heartbeated, and stopped when lost, there.
        self._runs = self._housekeeper.runs

    @property
    def peers(self) -> frozenset[str]:
        """The replicas of the namespace seen by the last heartbeat, this one among them: a
        scheduler spreads a burst over them (see ``_engine.capacity``)."""
        return self._housekeeper.peers

    @property
    def _session(self) -> LockSession | None:
        return self._statements.session

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
        return self._housekeeper.offset

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        self.replica_id = replica_id
        if on_lock_lost is not None:
            self._on_lock_lost = on_lock_lost
        self._housekeeper.attach(replica_id, self._on_lock_lost)
        session = self._statements.session = LockSession(
            self.conninfo,
            application_name=f"replicron {replica_id}"[:63],
            connect_timeout=self.connect_timeout,
            statement_deadline=self.statement_timeout,
            drop_after=self.stale_after,
            on_lost=self._housekeeper.session_lost,
            session_pooler=self.session_pooler,
        )
        await session.connect()
        if self.migrate:
            await migrate_session(session)
        await self._housekeeper.start()

    async def close(self) -> None:
        await self._housekeeper.stop()
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
        self._runs.close()

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        unique, where = once_per_tick(requests)  # a tick asked for twice: the repeat is TAKEN
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        with self._tokens.attempt(ticks) as tokens:
            rows = await self._fetch(
                "claim",
                retry=True,  # the token makes a retry recognise the rows its first try inserted
                jobs=[r.job for r in unique],
                ticks=[r.scheduled_at for r in unique],
                keys=[self.lock_key(r.job) for r in unique],
                locks=[r.lock for r in unique],
                manual=[r.manual for r in unique],
                limits=[r.max_runs for r in unique],
                replica=self.replica_id,
                tokens=tokens,
                ahead=CLAIM_AHEAD,
                stale_after=timedelta(seconds=self.stale_after),
            )  # fmt: skip
        sent = self._statements.sent_at()
        claimed = [ClaimRow(*row) for row in rows]
        if any(row.status == "moved" for row in claimed):
            refuse_pooler(self._statements, self.replica_id)
        won = {(row.job, row.tick.astimezone(UTC)): row for row in claimed}
        answers = []
        for request, tick in zip(unique, ticks, strict=True):
            row = won.get(tick)
            if row is None:  # no row came back for it: somebody has it
                answers.append(taken_repeat(request))
                continue
            if (pid := row.frozen_holder) is not None:
                await self._housekeeper.blocked_by_frozen(request.job, row.blocker, pid)
            if row.opened is not None:
                self._runs.claimed(row.opened)
            if row.locked_run is not None:
                self._runs.locked(self.lock_key(request.job), row.locked_run, sent)
            answers.append(row.claim(request))
        return answer_each(requests, answers, where, taken_repeat)

    async def lock(self, claim: Claim) -> bool:
        key = self.lock_key(claim.job)
        if key in self._runs.locks:  # the session would take it again: it re-enters its locks
            return False
        [(locked,)] = await self._fetch(
            "lock",
            key=key,
            job=claim.job,
            run_id=claim.run_id,
            stale_after=timedelta(seconds=self.stale_after),
        )
        if locked is None:
            refuse_pooler(self._statements, self.replica_id)
        if locked:
            assert claim.run_id is not None
            self._runs.locked(key, claim.run_id, self._statements.sent_at())
        return bool(locked)

    async def release(self, releases: Sequence[Release]) -> None:
        """Record the outcomes (and drop the locks); an outcome that cannot be written now is
        kept and written with the next release or heartbeat, on a new session if need be."""
        self._runs.finished(r.record.run_id for r in releases if r.record.run_id is not None)
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

    async def _write_pending(self) -> None:
        """Write the outcomes whose write failed before, on a new session if need be."""
        if self._unwritten:
            await self._write_outcomes([])

    async def _write_outcomes(self, releases: Sequence[Release]) -> None:
        batch = self._unwritten + list(releases)
        self._unwritten = []
        unlocking: list[tuple[int, RunRecord]] = []  # the locks this batch unlocks
        for record, unlock in batch:
            key = self.lock_key(record.job)
            if unlock and self._runs.locks.take(key, record.run_id):
                unlocking.append((key, record))
        records = [release.record for release in batch]
        session = self._session
        assert session is not None
        generation = session.generation
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
                unlock_keys=[key for key, _ in unlocking],
            )
        except (BackendUnavailableError, asyncio.CancelledError):  # nothing known written
            kept = session.connected and session.generation == generation
            if kept:  # the session lives on (the statement was rolled back): so do its locks
                for key, record in unlocking:
                    self._runs.locks.give_back(key, record.run_id)
            unlocked_records = [record for _, record in unlocking]
            self._unwritten = [
                Release(record, kept and record in unlocked_records) for record in records
            ] + self._unwritten
            raise
        if session.generation != generation:
            unlocked = []  # retried on a new session: the locks had died with the old one
        elif None in unlocked:
            refuse_pooler(self._statements, self.replica_id)
        report_unheld(unlocking, unlocked, self.replica_id)
        for record, ok, before in zip(records, written, found, strict=True):
            log_write(record, ok, before, self.replica_id)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[bool | None]:
        unique, where = once_per_tick(records)  # a record listed twice is recorded once
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        with self._tokens.attempt(ticks) as tokens:
            rows = await self._fetch(
                "record_unclaimed",
                retry=True,  # the token recognises what a first try recorded
                jobs=[r.job for r in unique],
                ticks=[r.scheduled_at for r in unique],
                outcomes=[r.outcome.value for r in unique],
                errors=[r.error for r in unique],
                tokens=tokens,
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

    async def _last_writes(self) -> None:
        await self._write_pending()
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

    # ---- status ---------------------------------------------------------------------------

    async def status(self) -> list[JobStatus]:
        rows = await self._fetch("status", stale_after=timedelta(seconds=self.stale_after))
        return [job_status(row) for row in rows]

    async def namespaces(self) -> dict[str, int]:
        """Every namespace with recorded runs in this database, and its number of rows."""
        return await read_namespaces(self.conninfo, self.connect_timeout)

    async def replicas(self) -> list[ReplicaStatus]:
        rows = await self._fetch("replicas", stale_after=timedelta(seconds=self.stale_after))
        return [replica_status(row) for row in rows]

    def _unreachable(self) -> bool:
        return self._statements.unreachable(within=self.heartbeat_interval)

    async def _fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        return await self._statements.fetch(name, retry=retry, **params)
