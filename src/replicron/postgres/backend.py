"""The PostgreSQL backend: every tick exactly once across replicas, no overlap, no leaked lock.

* A tick is claimed by inserting its unique ``(namespace, job, scheduled_at)`` row with
  ``ON CONFLICT DO NOTHING``: exactly one replica's insert succeeds, whatever the clocks say.
* No overlap: the job's session advisory lock is held for the run, and a run may start only if
  no other open run of the job is still heartbeating (a run whose replica lost its lock may
  still be going; the lock alone cannot see it).
* All of it on one lock session per replica; claims of one instant go in one round trip,
  the outcome and the unlock in one more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from replicron._tz import UTC
from replicron.backends.base import Claim, ClaimRequest, ClaimStatus, Release, RunRecord
from replicron.errors import ConfigurationError
from replicron.keys import job_lock_key

from ._session import BackendUnavailableError, LockSession
from ._sql import queries
from .migrate import migrate_session

__all__ = ["JobStatus", "LockKeyCollisionError", "PostgresBackend"]

logger = logging.getLogger("replicron")


class LockKeyCollisionError(ConfigurationError):
    """Two job names hash to the same advisory-lock key; rename one of them."""


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: str
    last_replica: str | None
    last_scheduled_at: datetime | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_outcome: str | None
    last_error: str | None
    last_success_at: datetime | None
    running: tuple[tuple[str, int], ...]  # (replica id, run id) of runs going on now
    missed: int


class PostgresBackend:
    """Coordinates replicas through one PostgreSQL database.

    ``namespace`` separates independent deployments sharing a database (lock keys are
    ``job_lock_key(namespace + name)``: end it with a separator such as ``"billing/"``).
    Open ticks heartbeat every ``heartbeat_interval`` seconds; a run whose heartbeat is older
    than ``stale_after`` (default three intervals) counts as dead. Finished rows older than
    ``retention`` are pruned, keeping each job's latest.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        namespace: str = "",
        migrate: bool = True,
        heartbeat_interval: float = 5.0,
        stale_after: float | None = None,
        retention: timedelta = timedelta(days=14),
        connect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(conninfo, str):
            conninfo = getattr(conninfo, "conninfo", conninfo)
            if not isinstance(conninfo, str):
                raise ConfigurationError("PostgresBackend needs a DSN or a psycopg pool")
        if heartbeat_interval <= 0:
            raise ConfigurationError("heartbeat_interval must be positive")
        self.conninfo = conninfo
        self.namespace = namespace
        self.migrate = migrate
        self.heartbeat_interval = heartbeat_interval
        self.stale_after = 3 * heartbeat_interval if stale_after is None else stale_after
        if self.stale_after <= heartbeat_interval:
            raise ConfigurationError("stale_after must be longer than heartbeat_interval")
        self.retention = retention
        self.connect_timeout = connect_timeout
        self.replica_id = ""
        self._session: LockSession | None = None
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        self._keys: dict[int, str] = {}  # lock key -> registered job name
        self._held: dict[int, int] = {}  # lock key -> run id holding it on this session
        self._open: set[int] = set()  # run ids of our claimed, unfinished ticks
        self._housekeeper: asyncio.Task[None] | None = None
        self._q = queries()

    # ---- Backend protocol ----------------------------------------------------------------

    def register_job(self, name: str) -> None:
        key = self.lock_key(name)
        other = self._keys.get(key)
        if other is not None and other != name:
            raise LockKeyCollisionError(
                f"job {name!r} has the same lock key ({key}) as job {other!r}: rename one"
            )
        self._keys[key] = name

    def unregister_job(self, name: str) -> None:
        self._keys.pop(self.lock_key(name), None)

    def lock_key(self, job: str) -> int:
        return job_lock_key(self.namespace + job)

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        self.replica_id = replica_id
        if on_lock_lost is not None:
            self._on_lock_lost = on_lock_lost
        self._session = LockSession(
            self.conninfo,
            application_name=f"replicron {replica_id}"[:63],
            connect_timeout=self.connect_timeout,
            on_lost=self._session_lost,
        )
        await self._session.connect()
        if self.migrate:
            await migrate_session(self._session)
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeep())

    async def close(self) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeper
            self._housekeeper = None
        if self._session is not None:
            await self._session.close()
        self._held.clear()

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        # A tick asked for twice in one batch is claimed once: the repeat is TAKEN.
        unique: dict[tuple[str, datetime], ClaimRequest] = {}
        for request in requests:
            unique.setdefault((request.job, request.scheduled_at.astimezone(UTC)), request)
        batch = list(unique.values())
        rows = await self._fetch(
            "claim",
            jobs=[r.job for r in batch],
            ticks=[r.scheduled_at for r in batch],
            keys=[self.lock_key(r.job) for r in batch],
            locks=[r.lock for r in batch],
            replica=self.replica_id,
            stale_after=timedelta(seconds=self.stale_after),
        )
        won = {(job, tick.astimezone(UTC)): (run_id, locked) for run_id, job, tick, locked in rows}
        claims = []
        for request in requests:
            tick = request.scheduled_at
            result = won.pop((request.job, tick.astimezone(UTC)), None)
            if result is None:
                claims.append(Claim(request.job, tick, ClaimStatus.TAKEN, None, False))
                continue
            run_id, locked = result
            self._open.add(run_id)
            if locked is False:
                claims.append(Claim(request.job, tick, ClaimStatus.LOCKED, None, False))
                continue
            if locked:
                self._held[self.lock_key(request.job)] = run_id
            claims.append(Claim(request.job, tick, ClaimStatus.CLAIMED, run_id, bool(locked)))
        return claims

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
        if locked:
            assert claim.run_id is not None
            self._held[key] = claim.run_id
        return bool(locked)

    async def release(self, releases: Sequence[Release]) -> None:
        unlock_keys, unlocking = [], []
        for record, unlock in releases:
            key = self.lock_key(record.job)
            # Unlock only a lock this session still holds for this run: after a lost session
            # the lock is gone, and another replica may hold the key now.
            if unlock and key in self._held and self._held[key] == record.run_id:
                del self._held[key]
                unlock_keys.append(key)
                unlocking.append(record.job)
        records = [record for record, _ in releases]
        [(recorded, unlocked)] = await self._fetch(
            "release",
            jobs=[r.job for r in records],
            ticks=[r.scheduled_at for r in records],
            outcomes=[r.outcome.value for r in records],
            started=[r.started_at for r in records],
            finished=[r.finished_at for r in records],
            errors=[r.error for r in records],
            unlock_keys=unlock_keys,
        )
        for record in records:
            if record.run_id is not None:
                self._open.discard(record.run_id)
        for job, key, released in zip(unlocking, unlock_keys, unlocked, strict=True):
            if not released:
                logger.error(
                    "job %r: advisory lock %s was not held at unlock", job, key,
                    extra={"event": "lock_error", "job": job, "replica": self.replica_id},
                )  # fmt: skip
        if recorded != len(records):
            logger.error(
                "%d of %d outcomes found no ledger row", len(records) - recorded, len(records),
                extra={"event": "lock_error", "replica": self.replica_id},
            )  # fmt: skip

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[bool]:
        first: dict[tuple[str, datetime], RunRecord] = {}
        for record in records:
            first.setdefault((record.job, record.scheduled_at.astimezone(UTC)), record)
        unique = list(first.values())
        rows = await self._fetch(
            "record_unclaimed",
            jobs=[r.job for r in unique],
            ticks=[r.scheduled_at for r in unique],
            outcomes=[r.outcome.value for r in unique],
            errors=[r.error for r in unique],
            replica=self.replica_id,
        )
        recorded = {(job, tick.astimezone(UTC)) for job, tick in rows}
        answers = []
        for record in records:  # a record listed twice is recorded once: by its first mention
            key = (record.job, record.scheduled_at.astimezone(UTC))
            answers.append(key in recorded)
            recorded.discard(key)
        return answers

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        rows = await self._fetch("last_ticks", jobs=list(jobs))
        return {job: tick.astimezone(UTC) for job, tick in rows}

    # ---- status and housekeeping ---------------------------------------------------------

    async def status(self) -> list[JobStatus]:
        rows = await self._fetch("status")
        return [_job_status(row) for row in rows]

    async def _housekeep(self) -> None:
        """Heartbeat open ticks and check our locks; now and then, abandon the open ticks of
        dead replicas and prune old rows."""
        beats = 0
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            beats += 1
            try:
                await self._heartbeat()
                if beats % 12 == 1:
                    await self._janitor()
            except BackendUnavailableError as exc:
                logger.warning("heartbeat failed: %s", exc, extra={"event": "lock_error"})
            except Exception:
                logger.exception("housekeeping failed", extra={"event": "lock_error"})

    async def _heartbeat(self) -> None:
        if not self._open and not self._held:
            return
        [(_, held)] = await self._fetch("heartbeat", run_ids=sorted(self._open))
        present = {(k - (1 << 64)) if k >= 1 << 63 else k for k in held}
        missing = [key for key in self._held if key not in present]
        if missing:
            # The session is alive but our locks are gone (someone unlocked them): the runs
            # holding them are no longer protected.
            self._lose([self._held.pop(key) for key in missing])

    async def _janitor(self) -> None:
        stale = await self._fetch("abandon_stale", stale_after=timedelta(seconds=self.stale_after))
        for job, tick, replica in stale:
            logger.warning(
                "job %r tick %s: replica %s stopped heartbeating; recorded abandoned",
                job, tick.isoformat(), replica,
                extra={"event": "abandoned", "job": job, "tick": tick.isoformat(),
                       "replica": self.replica_id},
            )  # fmt: skip
        await self._fetch("prune", retention=self.retention, batch=1000)

    def _session_lost(self) -> None:
        lost = list(self._held.values())
        self._held.clear()
        if lost:
            self._lose(lost)

    def _lose(self, run_ids: list[int]) -> None:
        logger.error(
            "lost the advisory locks of runs %s", run_ids,
            extra={"event": "lock_lost", "replica": self.replica_id},
        )  # fmt: skip
        self._on_lock_lost(run_ids)

    async def _fetch(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        if self._session is None:
            raise BackendUnavailableError("the backend is not open")
        params.setdefault("namespace", self.namespace)
        return await self._session.fetch(self._q[name], params)


def _job_status(row: tuple[Any, ...]) -> JobStatus:
    (job, replica, scheduled, started, finished, outcome, error, success, running, missed) = row
    pairs = []
    for item in running:
        who, _, run_id = item.rpartition(" ")
        pairs.append((who, int(run_id)))
    return JobStatus(
        job, replica, scheduled, started, finished, outcome, error, success, tuple(pairs),
        int(missed),
    )  # fmt: skip
