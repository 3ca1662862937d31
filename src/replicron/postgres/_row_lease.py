"""Row-lease coordination: a job's lock is its row of ``replicron_job_locks``, live while its
``lease_until`` is ahead of the server's now.

Nothing lives in a server session, so any connection will do (a transaction pooler, the
application's own pool): a lost connection loses nothing, the rows run out on the server's
clock, and a run's row and lock are renewed by compare-and-set on its epoch, which a janitor
bumps when it writes the run off, so a fenced holder writes nothing more. The statements are
``sql/lease.sql``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, timedelta
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from replicron.backends.base import Claim, ClaimRequest, RunRecord

from ._claims import CLAIM_AHEAD, ClaimRow
from ._coordination import Beat, CoordinationMode, Won
from ._failover import ServerIdentity
from ._pooled import BorrowedSession, PooledSession
from ._runs import HeldRuns
from ._session import LockSession
from ._setting_names import SettingNames
from ._statements import Statements

__all__ = ["RowLeases"]

#: The backend's records keep the logger they are documented under.
logger = logging.getLogger("replicron.postgres.backend")


class RowLeases:
    """Coordination through lock rows that run out on the server's clock."""

    name: CoordinationMode = "lease"
    locks_noun = "leases"

    def __init__(self, statements: Statements, stale_after: timedelta) -> None:
        self._statements = statements
        self._stale_after = stale_after

    def session(
        self,
        conninfo: str,
        pool: AsyncConnectionPool[Any] | None,
        on_lost: Callable[[], None],
        **options: Any,
    ) -> LockSession:
        # Nothing is lost with a connection: the leases run out on their own.
        if pool is not None:
            return BorrowedSession(pool, on_lost=lambda: None, **options)
        return PooledSession(conninfo, on_lost=lambda: None, **options)

    async def check_server(
        self, conninfo: str, connect_timeout: float, setting_names: SettingNames
    ) -> None:
        """Any server will do: no lock needs a server session of its own."""

    async def claim(
        self,
        unique: Sequence[ClaimRequest],
        keys: Sequence[int],
        tokens: Sequence[UUID],
        replica: str,
    ) -> Won:
        """Every tick in one statement, which answers the ticks another replica has already
        without trying them (no insert, no run id drawn); each won row comes with the epoch
        this replica holds it in."""
        rows = await self._statements.fetch(
            "lease_claim",
            retry=True,  # the token makes a retry recognise the rows its first try inserted
            jobs=[r.job for r in unique],
            ticks=[r.scheduled_at for r in unique],
            locks=[r.lock for r in unique],
            manual=[r.manual for r in unique],
            limits=[r.max_runs for r in unique],
            replica=replica,
            tokens=list(tokens),
            ahead=CLAIM_AHEAD,
            stale_after=self._stale_after,
        )
        return {
            (job, tick.astimezone(UTC)): (
                ClaimRow(job, tick, run_id, status, holder, False, None),
                epoch,
            )
            for job, tick, run_id, status, holder, epoch in rows
        }

    async def lock(self, claim: Claim, key: int, epoch: int | None, replica: str) -> bool:
        [(locked,)] = await self._statements.fetch(
            "lease_lock",
            retry=True,  # a compare-and-set that a second try of the same run passes again
            job=claim.job,
            run_id=claim.run_id,
            epoch=epoch,
            replica=replica,
            stale_after=self._stale_after,
        )
        return bool(locked)

    def locks_survive(self, session: LockSession, generation: int) -> bool:
        return True  # lock rows outlive every connection

    async def release(
        self,
        params: dict[str, Any],
        unlocking: Sequence[tuple[int, RunRecord]],
        generation: int,
        replica: str,
    ) -> tuple[Sequence[bool], Sequence[str | None]]:
        [(written, found, unlocked)] = await self._statements.fetch(
            "lease_release",
            retry=True,  # written by run id and epoch, never over another outcome: idempotent
            **params,
        )
        for (_, record), released in zip(unlocking, unlocked, strict=False):
            if released is False:  # the run fenced itself; a janitor freed its job's lock row
                logger.warning(
                    "job %r: its lock was no longer run %s's at release (its lease had ended "
                    "and a janitor freed it, or an earlier try of this release did)",
                    record.job,
                    record.run_id,
                    extra={"event": "lock_error", "job": record.job, "replica": replica},
                )
        return written, found

    async def heartbeat(self, runs: HeldRuns, run_ids: Sequence[int], **params: Any) -> Beat:
        """Renew every row and job lock this replica holds in one statement. A locked run
        whose lock row or row was not renewed is lost, then any other run whose row was not
        (a janitor wrote it off, another run took the lock over)."""
        locked = runs.locks.runs()
        [
            (db_now, refreshed, relocked, peers, holder, epoch, *server)
        ] = await self._statements.fetch(
            "lease_heartbeat",
            retry=True,  # a renewal is a compare-and-set: running it twice changes nothing
            run_ids=run_ids,
            epochs=[runs.epochs.get(run_id, 0) for run_id in run_ids],
            locked_runs=locked,
            **params,
        )

        def lost(unrefreshed: set[int]) -> list[int]:
            # Only locks still held now: a release may have run between a failed first try
            # of this heartbeat and its retry.
            held = set(runs.locks.runs())
            ended = set(locked) - set(relocked)
            lost = sorted((ended | (unrefreshed & set(locked))) & held)
            return lost + sorted(unrefreshed - set(lost))

        sent_at = self._statements.sent_at()
        # Connections of a pool are not checked as they open: the heartbeat reads the server.
        server_identity = ServerIdentity(*server)
        return Beat(db_now, peers, (holder, epoch), server_identity, refreshed, sent_at, lost)

    async def abandon_stale(self, stale_after: timedelta) -> list[Any]:
        return await self._statements.fetch(
            "lease_abandon_stale", retry=True, stale_after=stale_after
        )

    def deadline_passed(self) -> None:
        """The lock rows run out on the server's clock: nothing to give up here."""

    async def free_locks(self, run_ids: Sequence[int], replica: str) -> None:
        if run_ids:
            await self._statements.fetch("lease_free", run_ids=list(run_ids), replica=replica)
