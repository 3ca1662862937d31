"""PostgreSQL housekeeping: the heartbeat, the run deadlines, the clock offset, the janitor,
and what happens when the runs this replica holds are lost.

Every ``heartbeat_interval`` the heartbeat (its statement the coordination mode's) refreshes
the rows of this replica's open runs (renewing their run deadlines), notes the replica as
seen with its clock offset, learns its peers and checks that its runs' locks are still
theirs; the outcomes whose write failed are written after it; every twelfth time the janitor
records the open runs of dead replicas abandoned and prunes old rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from replicron.backends.base import RUN_REQUEST_EXPIRY
from replicron.backends.leadership import LeaderTerm

from ._coordination import Coordination
from ._deadline import RunDeadline
from ._failover import ServerWatch
from ._offset import OffsetEstimator
from ._runs import HeldRuns
from ._session import BackendUnavailableError
from ._statements import Statements

__all__ = ["OFFSET_WARNING", "Housekeeper", "MixedModesError"]

#: The backend's records keep the logger they are documented under.
logger = logging.getLogger("replicron.postgres.backend")

#: A replica whose clock is off the database's by more than this is warned about.
OFFSET_WARNING = 1.0
#: The janitor runs with the loop's first heartbeat and every this many after it.
JANITOR_EVERY = 12


class MixedModesError(BackendUnavailableError):
    """Replicas of the other coordination mode share this replica's namespace: it claims
    nothing (as if the database could not be reached) until they are gone."""


class Housekeeper:
    """Keeps the replica's held runs (``runs``) alive and the ledger tidy, through the
    backend's ``statements`` and its mode's ``coordination``, and tells ``on_lock_lost`` of
    the runs that must stop."""

    def __init__(
        self,
        statements: Statements,
        coordination: Coordination,
        *,
        heartbeat_interval: float,
        stale_after: float,
        lease: float,
        retention: timedelta,
        fence_stale_holders: bool,
    ) -> None:
        self._statements = statements
        self.coordination = coordination
        self._interval = heartbeat_interval
        self._stale_after = timedelta(seconds=stale_after)
        self._retention = retention
        self._fence = fence_stale_holders
        self.runs = HeldRuns(RunDeadline(lease, self._deadline_passed))
        #: Leader mode: this replica's term as leader, as long as its runs' lease.
        self.leader = LeaderTerm()
        self._leader_term = timedelta(seconds=lease)
        #: The server this replica talks to; a failover stops the held runs.
        self.server = ServerWatch(statements.namespace, held=self.runs.going_on, lose=self._lose)
        self.replica_id = ""
        self._on_lock_lost: Callable[[Sequence[int]], None] = lambda _: None
        #: The replicas of the namespace seen by the last heartbeat, this one among them.
        self.peers: frozenset[str] = frozenset()
        #: Stopping: claims no more, and its heartbeats (while its last runs finish) keep it
        #: gone for the others.
        self.leaving = False
        #: Open (past the check at start, which refuses to open beside the other mode).
        self.opened = False
        self._offsets = OffsetEstimator()
        self._offset_warned = False
        self._task: asyncio.Task[None] | None = None
        self._beating = asyncio.Lock()
        #: Monotonic: until then the other replicas count this one live (its last heartbeat's
        #: send, plus ``stale_after``: the heartbeat's now() is no earlier).
        self._live_until = 0.0
        #: Why this replica may not claim (replicas of the other mode share its namespace),
        #: or None; checked whenever it joins, or comes back after the others counted it gone.
        self.refusal: str | None = None
        self._admitted = False

    @property
    def offset(self) -> timedelta | None:
        """How far the database's clock is ahead of this replica's (best recent sample)."""
        return self._offsets.current  # from any thread: one reference, set by the loop

    def attach(self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None]) -> None:
        """Speak for ``replica_id`` from now on (before its session opens: it may be lost)."""
        self.replica_id = self.server.replica_id = self.leader.replica_id = replica_id
        self._on_lock_lost = on_lock_lost

    async def start(self, write_pending: Callable[[], Awaitable[None]]) -> None:
        """Be seen, and keep house from now on: each loop's heartbeat is followed by
        ``write_pending``, which writes the outcomes that wait to be written."""
        self.leaving = False  # a backend opened again after a shutdown
        for _ in range(3):  # the offset is needed before the first tick is planned
            await self._sample_clock()
        await self.heartbeat()  # seen by the other replicas, and seeing them, from the start
        self._task = asyncio.get_running_loop().create_task(self._housekeep(write_pending))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _housekeep(self, write_pending: Callable[[], Awaitable[None]]) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self._interval)
            beats += 1
            try:
                await self.heartbeat()
                await write_pending()
                if beats % JANITOR_EVERY == 1:
                    await self.janitor()
            except BackendUnavailableError as exc:
                # The scheduler says the database is unavailable, once; what it costs the runs
                # held here (their lease running out) is said when it happens.
                logger.debug("heartbeat failed: %s", exc, extra={"event": "lock_error"})
            except Exception:
                logger.exception("housekeeping failed", extra={"event": "lock_error"})

    async def heartbeat(self) -> None:
        """Refresh the open runs (and their lease), be seen with the clock offset, see the
        peers; a locked run whose lock or row is gone here is lost. Coming back after the
        others may have counted this replica gone, check that the namespace's replicas still
        coordinate in its mode (one of another mode may have started meanwhile)."""
        async with self._beating:
            if time.monotonic() >= self._live_until:
                self._admitted = False
            await self._beat()
            self._live_until = self._statements.sent_at() + self._stale_after.total_seconds()
            if not self._admitted:
                await self._check_modes()

    async def lead_now(self) -> None:
        """Leader mode, as this replica starts contending: take the lease now if it is free,
        rather than at the next heartbeat (whose statement takes and renews it after)."""
        async with self._beating:
            if not self._contending():
                return
            sent = time.monotonic()
            try:
                found = await self._statements.fetch(
                    "leader_lease",
                    retry=True,
                    replica=self.replica_id,
                    leader_lease=self._leader_term,
                )
            except Exception as exc:  # the heartbeats try again
                logger.debug("leader lease: %s", exc, extra={"event": "lock_error"})
                return
            self._led(sent, *(found[0][:2] if found else (None, 0)))

    def _contending(self) -> bool:
        return self.leader.contending and not self.leaving and self.refusal is None

    def _led(self, sent: float, holder: str | None, epoch: int | None) -> None:
        """Leader mode: a compare-and-set of the lease sent at ``sent`` (monotonic, read
        before the statement: before the server's now(), so the term ends here first; not
        the session's last round trip, which on a pool may be another statement's) found
        ``holder``."""
        if epoch is not None:
            self.leader.seen(holder, epoch, sent, self._leader_term.total_seconds())

    async def admit(self) -> None:
        """Before a claim: raise :class:`MixedModesError` unless this replica may claim. A
        replica the others may have counted gone (a frozen process, a long partition) is
        seen again and checked first, before it claims anything."""
        if not self._admitted or time.monotonic() >= self._live_until:
            await self.heartbeat()
        if self.refusal is not None:
            raise MixedModesError(self.refusal)

    async def _check_modes(self) -> None:
        others = await self._statements.fetch(
            "other_modes",
            retry=True,
            replica=self.replica_id,
            coordination=self.coordination.name,
            stale_after=self._stale_after,
        )
        refusal = None
        if others:
            named = ", ".join(f"{replica} ({mode})" for replica, mode in others)
            refusal = (
                f"replicas coordinating in another mode than {self.coordination.name!r} share the "
                f"namespace: {named}. The modes' locks do not see each other: stop them all, or "
                "give this replica their mode"
            )
            if refusal != self.refusal and self.opened:  # at open: the replica fails to start
                logger.error(
                    "%s; claiming nothing until they are gone",
                    refusal,
                    extra={"event": "lock_error", "replica": self.replica_id},
                )
        elif self.refusal is not None:
            logger.warning(
                "no replica of another mode is left in the namespace: claiming again",
                extra={"event": "lock_error", "replica": self.replica_id},
            )
        self.refusal, self._admitted = refusal, refusal is None

    async def join(self, since: datetime) -> None:
        """From ``since`` on this replica plans every tick: what a leaving one may hand it."""
        await self._statements.fetch("replica_joined", replica=self.replica_id, since=since)

    async def leave(self) -> dict[str, datetime]:
        """This replica claims no more: gone for the others at once; the replicas that stay,
        read once that is committed, with the instant each one joined at."""
        self.leaving = True
        await self._statements.fetch("replica_stopped", replica=self.replica_id)
        if self.leader.contending:  # a standby takes over at its next heartbeat
            self.leader.resigned()
            await self._statements.fetch("leader_resign", replica=self.replica_id)
        staying = await self._statements.fetch(
            "replicas_staying", replica=self.replica_id, stale_after=self._stale_after
        )
        return dict(staying)

    async def _beat(self) -> None:
        """One heartbeat statement of the mode's; then the runs it could not prove live stop."""
        offset = self._offsets.current
        contending, before = self._contending(), time.monotonic()
        sent = self.runs.to_heartbeat()
        beat = await self.coordination.heartbeat(
            self.runs,
            sent,
            replica=self.replica_id,
            offset_ms=None if offset is None else offset.total_seconds() * 1000,
            stale_after=self._stale_after,
            leaving=self.leaving,
            contending=contending,
            leader_lease=self._leader_term,
        )
        if contending:
            self._led(before, *beat.leader)
        self.peers = frozenset(beat.peers) | {self.replica_id}
        self._clock_sample(beat.db_now)
        if beat.server is not None:
            self.server.seen(beat.server)
            if self.server.pending:  # a failover: the held runs were told to stop
                session = self._statements.session
                assert session is not None
                await self.server.restore(session.fetch)
                return
        unrefreshed = self.runs.heartbeaten(sent, beat.refreshed, beat.sent_at)
        lost = beat.lost(unrefreshed)
        if lost:
            self.runs.locks.forget(lost)
            self._lose(lost)

    # ---- the clock offset ----------------------------------------------------------------

    async def _sample_clock(self) -> None:
        [(_, db_now)] = await self._statements.fetch("clock_sample")
        self._clock_sample(db_now)

    def _clock_sample(self, db_now: datetime) -> None:
        self._offsets.add(db_now, *self._statements.round_trip())
        ahead = -self._offsets.current.total_seconds() if self._offsets.current else 0.0
        off = abs(ahead) > OFFSET_WARNING
        if off and not self._offset_warned:
            logger.warning(
                "this replica's clock is %+.3f s off the database's; replicron schedules on "
                "the database's clock, but fix the host's time synchronisation",
                ahead,
                extra={"event": "clock_offset", "replica": self.replica_id},
            )
        self._offset_warned = off

    # ---- the janitor and frozen holders --------------------------------------------------

    async def janitor(self) -> None:
        """Record the open runs of replicas that stopped heartbeating abandoned; prune old
        rows and registrations."""
        if self.refusal is not None:  # the namespace is the other mode's to look after
            return
        stale = await self.coordination.abandon_stale(self._stale_after)
        for job, tick, replica in stale:
            logger.warning(
                "job %r tick %s: replica %s stopped heartbeating; recorded abandoned",
                job,
                tick.isoformat(),
                replica,
                extra={
                    "event": "abandoned",
                    "job": job,
                    "tick": tick.isoformat(),
                    "replica": self.replica_id,
                },
            )
        await self._statements.fetch(
            "prune", retention=self._retention, requests_keep=RUN_REQUEST_EXPIRY, batch=1000
        )
        await self._statements.fetch("prune_registry", retention=self._retention)

    async def blocked_by_frozen(self, job: str, replica: str | None, pid: int) -> None:
        """The job's lock is held by a session whose run stopped heartbeating: its replica is
        frozen (or cut off in a way its server session does not notice)."""
        fence = " (fencing it)" if self._fence else ""
        logger.warning(
            "job %r is blocked by replica %s: its heartbeat is stale but its server session "
            "%s still holds the job's lock%s",
            job,
            replica,
            pid,
            fence,
            extra={"event": "blocked", "job": job, "replica": self.replica_id},
        )
        if self._fence:
            with contextlib.suppress(BackendUnavailableError):
                await self._statements.fetch(
                    "fence_stale_holder",
                    job=job,
                    replica=self.replica_id,
                    stale_after=self._stale_after,
                )

    # ---- losing the session or the lease -------------------------------------------------

    def session_lost(self) -> None:
        """The lock session went, and every lock on it: their runs must stop."""
        lost = self.runs.session_lost()
        if lost:
            self._lose(lost)

    def _deadline_passed(self, run_ids: list[int]) -> None:
        logger.error(
            "no heartbeat got through for %.1f s: stopping runs %s before other replicas may "
            "take their jobs over",
            self.runs.deadline.length,
            run_ids,
            extra={"event": "lock_lost", "replica": self.replica_id},
        )
        self.runs.locks.forget(run_ids)
        self._on_lock_lost(run_ids)
        self.coordination.deadline_passed()

    def _lose(self, run_ids: list[int]) -> None:
        logger.error(
            "lost the %s of runs %s",
            self.coordination.locks_noun,
            run_ids,
            extra={"event": "lock_lost", "replica": self.replica_id},
        )
        self.runs.lost(run_ids)
        self._on_lock_lost(run_ids)
