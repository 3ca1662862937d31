"""The PostgreSQL backend: every tick exactly once across replicas, no overlap, no leaked lock.

* A tick is claimed by inserting its unique ``(namespace, job, scheduled_at)`` row with
  ``ON CONFLICT DO NOTHING``: exactly one replica's insert succeeds, whatever the clocks say,
  and never before the tick is due by the database's clock.
* No overlap: the job's session advisory lock is held for the run, and a run may start only if
  no other open run of the job is still heartbeating (a run whose replica lost its lock may
  still be going; the lock alone cannot see it). The replica stops its own runs when its lease
  runs out, before their rows go stale for the others (``_deadline``, ``_runs``).
* The heartbeat, the clock offset, the janitor and what follows a lost session or lease are
  the housekeeper's (``_housekeeping``); how a job's lock is held and proven live is the
  coordination mode's (``_coordination``: ``_advisory`` or ``_row_lease``), picked here.
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
from typing import Any, get_args

from psycopg_pool import AsyncConnectionPool

from replicron.backends.base import (
    Claim,
    ClaimRequest,
    LastFinish,
    Release,
    RunRecord,
    answer_each,
    once_per_tick,
    taken_repeat,
)
from replicron.backends.leadership import Leader
from replicron.cluster import ClusterStatus, JobDefinition, Registration
from replicron.errors import ConfigurationError, LockKeyCollisionError
from replicron.events import Outcome
from replicron.keys import LockKeyRegistry, check_namespace, job_lock_key

from ._advisory import AdvisoryLocks
from ._cluster import ClusterCalls, Database
from ._coordination import Coordination, CoordinationMode
from ._failover import ServerIdentity
from ._housekeeping import Housekeeper
from ._row_lease import RowLeases
from ._session import LockSession
from ._setting_names import PYTHON_NAMES, SettingNames
from ._sources import ConnectionSource, conninfo_of
from ._statements import Statements
from ._status import JobStatus, ReplicaStatus, job_status, replica_status
from ._tokens import ClaimTokens
from ._writes import OutcomeWrites, log_unwritten
from .migrate import migrate_session

__all__ = [
    "CoordinationMode",
    "JobStatus",
    "LockKeyCollisionError",
    "PostgresBackend",
    "ReplicaStatus",
]

logger = logging.getLogger(__name__)


class PostgresBackend:
    """Coordinates replicas through one PostgreSQL database.

    ``namespace`` separates independent deployments sharing a database (lock keys are
    ``job_lock_key(namespace + name)``: end it with a separator such as ``"billing/"``).
    Open ticks heartbeat every ``heartbeat_interval`` seconds; a run whose heartbeat is older
    than ``stale_after`` (default three intervals) counts as dead for the other replicas, and
    this replica stops its own runs ``heartbeat_interval`` before that (its lease) unless a
    heartbeat got through meanwhile. Every statement has a deadline (``statement_timeout``,
    default half the lease). ``fence_stale_holders`` lets a replica terminate the server
    session of a frozen replica that holds a job's lock with a stale heartbeat. Finished rows
    older than ``retention`` are pruned, keeping each job's latest. ``setting_names`` is how
    the code that builds the backend spells its settings, for its refusals to name them (the
    daemon and the Django app pass their own; see :class:`SettingNames`).
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
        coordination: CoordinationMode = "advisory",
        setting_names: SettingNames = PYTHON_NAMES,
    ) -> None:
        if heartbeat_interval <= 0:
            raise ConfigurationError("heartbeat_interval must be positive")
        if coordination not in get_args(CoordinationMode):
            raise ConfigurationError(
                f"coordination must be 'advisory' or 'lease', not {coordination!r}"
            )
        self.coordination: CoordinationMode = coordination
        self.conninfo = conninfo_of(conninfo)
        #: Lease mode on the application's own pool: statements borrow its connections.
        self._pool = conninfo if isinstance(conninfo, AsyncConnectionPool) else None
        self.namespace = check_namespace(namespace)
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
        self.setting_names = setting_names
        self.retention = retention
        self.connect_timeout = connect_timeout
        self.replica_id = ""
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        self._keys = LockKeyRegistry(self.lock_key)
        self._tokens = ClaimTokens()  # of ticks whose claim (or miss record) failed
        self._statements = Statements(namespace)  # on the lock session, once open
        self._coordination = self._coordination_for(coordination)
        self._housekeeper = Housekeeper(
            self._statements,
            self._coordination,
            heartbeat_interval=heartbeat_interval,
            stale_after=self.stale_after,
            lease=self.lease,
            retention=retention,
            fence_stale_holders=fence_stale_holders,
        )
        # Claimed, locked and finished here; heartbeated, and stopped when lost, there.
        self._runs = self._housekeeper.runs
        self._writes = OutcomeWrites(
            self._statements,
            self._coordination,
            self._housekeeper,
            self._tokens,
            lock_key=self.lock_key,
            unreachable=self._unreachable,
        )
        #: The namespace's registry, pauses and run requests.
        self._cluster = ClusterCalls(
            self._statements,
            Database(self.conninfo, connect_timeout, self.statement_timeout),
            self.stale_after,
            lambda: self.replica_id,
        )
        self._leading_task: asyncio.Task[None] | None = None

    def _coordination_for(self, mode: CoordinationMode) -> Coordination:
        """The one place that asks which mode this backend coordinates in."""
        stale_after = timedelta(seconds=self.stale_after)
        if mode == "lease":
            if self.fence_stale_holders or self.session_pooler:
                raise ConfigurationError(
                    "fence_stale_holders and session_pooler are advisory mode's: in lease mode "
                    "a frozen holder's lease runs out, and any pooler may sit in between"
                )
            return RowLeases(self._statements, stale_after)
        return AdvisoryLocks(self._statements, stale_after)

    async def join(self, since: datetime) -> None:
        await self._housekeeper.join(since)

    async def leave(self) -> dict[str, datetime]:
        """This replica stops claiming (it is shutting down): gone for the others at once,
        so that they no longer leave it ticks; returns the replicas that stay."""
        return await self._housekeeper.leave()

    def contend(self, on_change: Callable[[], None]) -> None:
        """Leader mode: seek the namespace's leader lease (now, and with every heartbeat);
        held, it lasts as long as a run's lease (``stale_after - heartbeat_interval``)."""
        self._housekeeper.leader.contend(on_change)
        self._leading_task = asyncio.get_running_loop().create_task(self._housekeeper.lead_now())

    def leading(self) -> bool:
        return self._housekeeper.leader.leading()

    @property
    def leader(self) -> Leader | None:
        return self._housekeeper.leader.leader

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

    @property
    def refusal(self) -> str | None:
        """Why this replica claims nothing now (replicas of the other coordination mode
        share its namespace: see :class:`MixedModesError`), or ``None``."""
        return self._housekeeper.refusal

    def lock_key(self, job: str) -> int:
        return job_lock_key(self.namespace + job)

    def lease_end(self, run_id: int) -> float | None:
        """When the locked run ``run_id`` must stop unless a heartbeat renews its lease
        (``time.monotonic()``, which the daemon's reaper reads too); ``None`` if it holds none."""
        return self._runs.deadline.end_of(run_id)

    @property
    def server_changes(self) -> int:
        """How many times the server changed under this replica (failovers: see
        docs/postgres.md, "Failover")."""
        return self._housekeeper.server.changes

    @property
    def server_identity(self) -> ServerIdentity | None:
        """The server this replica talks to: (system identifier, timeline), once connected."""
        return self._housekeeper.server.identity

    def _journal_claim(self, job: str, tick: datetime, run_id: int, manual: bool) -> None:
        self._housekeeper.server.journal.claimed(job, tick, run_id, manual)

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
        session = self._coordination.session(
            self.conninfo,
            self._pool,
            self._housekeeper.session_lost,
            application_name=f"replicron {replica_id}"[:63],
            connect_timeout=self.connect_timeout,
            # A heartbeat waits behind a new session no longer than a heartbeat interval.
            reconnect_deadline=min(self.connect_timeout, self.heartbeat_interval),
            statement_deadline=self.statement_timeout,
            drop_after=self.stale_after,
            session_pooler=self.session_pooler,
            setting_names=self.setting_names,
        )
        self._statements.session = session
        session.on_connect = self._housekeeper.server.check  # which server (a failover?)
        await session.connect()
        try:  # tried again by the start deadline, as the steps that follow
            await session.starting(
                lambda: self._coordination.check_server(
                    self.conninfo, self.connect_timeout, self.setting_names
                )
            )
        except BaseException:
            await session.close()
            raise
        if self.migrate:  # these steps too are tried again by the start deadline
            await session.starting(lambda: migrate_session(session))
        await session.starting(lambda: self._housekeeper.start(self._writes.write_pending))
        # After the first heartbeat, which says this replica's mode: of two replicas of
        # different modes starting at once, each sees the other.
        await self._refuse_mixed_modes()
        self._housekeeper.opened = True

    async def close(self) -> None:
        await self._housekeeper.stop()
        if (self._writes.unwritten or self._tokens) and not self._unreachable():
            with contextlib.suppress(Exception):  # one last try, bounded: shutdown goes on
                await asyncio.wait_for(self._writes.last_writes(), self.statement_timeout)
        if self._session is not None and not self._unreachable():
            with contextlib.suppress(Exception):  # bounded, and shutdown goes on regardless
                await asyncio.wait_for(self._stopped(), self.statement_timeout)
        for release in self._writes.unwritten:
            log_unwritten(release.record, self.replica_id)
        self._writes.unwritten.clear()
        if self._session is not None:
            await self._session.close()
        self._runs.close()

    async def _refuse_mixed_modes(self) -> None:
        refusal = self._housekeeper.refusal
        if refusal is not None:
            await self.close()
            raise ConfigurationError(f"namespace {self.namespace!r}: {refusal}")

    async def _stopped(self) -> None:
        """Gone for the others at once, with no lock left behind."""
        await self._coordination.free_locks(self._runs.locks.runs(), self.replica_id)
        await self._fetch("replica_stopped", replica=self.replica_id)

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        await self._housekeeper.admit()
        unique, where = once_per_tick(requests)  # a tick asked for twice: the repeat is TAKEN
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        with self._tokens.attempt(ticks) as tokens:
            won = await self._coordination.claim(
                unique, [self.lock_key(r.job) for r in unique], tokens, self.replica_id
            )
        sent = self._statements.sent_at()
        answers = []
        for request, tick in zip(unique, ticks, strict=True):
            found = won.get(tick)
            if found is None:  # no row came back for it: somebody has it
                answers.append(taken_repeat(request))
                continue
            row, epoch = found
            if (pid := row.frozen_holder) is not None:
                await self._housekeeper.blocked_by_frozen(request.job, row.blocker, pid)
            if row.opened is not None:
                self._runs.claimed(row.opened, epoch)
                self._journal_claim(request.job, tick[1], row.opened, request.manual)
            if row.locked_run is not None:
                self._runs.locked(self.lock_key(request.job), row.locked_run, sent)
            answers.append(row.claim(request))
        return answer_each(requests, answers, where, taken_repeat)

    async def lock(self, claim: Claim) -> bool:
        key = self.lock_key(claim.job)
        if key in self._runs.locks:  # the session would take it again: it re-enters its locks
            return False
        epoch = self._runs.epoch_of(claim.run_id)
        if not await self._coordination.lock(claim, key, epoch, self.replica_id):
            return False
        assert claim.run_id is not None
        self._runs.locked(key, claim.run_id, self._statements.sent_at())
        return True

    async def release(self, releases: Sequence[Release]) -> None:
        """Record the outcomes (and drop the locks); an outcome that cannot be written now is
        kept and written with the next release or heartbeat, on a new session if need be."""
        await self._writes.release(releases)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        return await self._writes.record_unclaimed(records)

    # ---- the cluster's registry, pauses and run requests ---------------------------------

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Write the jobs this replica schedules (as changed; with ``complete``, all of them)
        to the registry; returns the registrations of its jobs by live replicas that define
        them differently."""
        return await self._cluster.announce(definitions, removed, complete)

    async def cluster_status(self) -> ClusterStatus:
        """The namespace's jobs, pauses and replicas as the database has them (a short
        connection of its own: callable from any event loop, open or not)."""
        return await self._cluster.cluster_status()

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` on every replica of the namespace, from each one's next claim;
        False if it was paused already."""
        return await self._cluster.pause(job, by)

    async def resume(self, job: str) -> bool:
        """Resume ``job``; False if it was not paused."""
        return await self._cluster.resume(job)

    async def request_run(self, job: str, by: str) -> datetime:
        """Ask for one manual run of ``job`` across the namespace (see
        :class:`~replicron.backends.base.RunRequests`)."""
        return await self._cluster.request_run(job, by)

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        """The manual runs asked for ``jobs`` not yet run, oldest first."""
        return await self._cluster.run_requests(jobs)

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """A job dropped from the code is expected no more: the registrations of replicas
        that are gone go. Returns their replicas, and the live ones that still schedule it."""
        return await self._cluster.forget(job)

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        rows = await self._fetch("last_ticks", retry=True, jobs=list(jobs))
        return {job: tick.astimezone(UTC) for job, tick in rows}

    async def last_finishes(self, jobs: Sequence[str]) -> dict[str, LastFinish]:
        rows = await self._fetch("last_finishes", retry=True, jobs=list(dict.fromkeys(jobs)))
        return {
            job: LastFinish(
                tick.astimezone(UTC),
                None if finished is None else finished.astimezone(UTC),
                None if outcome is None else Outcome(outcome),
            )
            for job, tick, finished, outcome in rows
        }

    # ---- status ---------------------------------------------------------------------------

    async def status(self) -> list[JobStatus]:
        rows = await self._fetch("status", stale_after=timedelta(seconds=self.stale_after))
        return [job_status(row) for row in rows]

    async def namespaces(self) -> dict[str, int]:
        """Every namespace with recorded runs in this database, and its number of rows."""
        return await self._cluster.namespaces()

    async def replicas(self) -> list[ReplicaStatus]:
        rows = await self._fetch("replicas", stale_after=timedelta(seconds=self.stale_after))
        return [replica_status(row) for row in rows]

    def _unreachable(self) -> bool:
        return self._statements.unreachable(within=self.heartbeat_interval)

    async def _fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        return await self._statements.fetch(name, retry=retry, **params)
