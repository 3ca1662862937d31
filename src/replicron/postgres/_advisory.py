"""Advisory coordination: a job's lock is a session advisory lock on the replica's lock session.

So it lives and dies with that session: losing the session loses every lock at once (the
runs are told to stop), each heartbeat reads the session's locks in ``pg_locks``, and a
statement that ran on another server session than the lock session's (a transaction pooler
in between, where no session lock holds) ends all coordination through it. The statements
are ``sql/queries.sql``'s ``claim``, ``lock``, ``release``, ``heartbeat`` and
``abandon_stale``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, timedelta
from typing import Any, NoReturn
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from replicron.backends.base import Claim, ClaimRequest, RunRecord

from ._claims import CLAIM_AHEAD, ClaimRow
from ._coordination import Beat, CoordinationMode, Won
from ._probe import check_advisory_locks, open_probe_session
from ._runs import HeldRuns
from ._session import LockSession, TransactionPoolerError
from ._setting_names import PYTHON_NAMES, SettingNames
from ._statements import Statements

__all__ = ["AdvisoryLocks", "refuse_pooler"]

#: The backend's records keep the logger they are documented under.
logger = logging.getLogger("replicron.postgres.backend")


class AdvisoryLocks:
    """Coordination through session advisory locks on one lock session per replica."""

    name: CoordinationMode = "advisory"
    locks_noun = "advisory locks"

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
        return LockSession(conninfo, on_lost=on_lost, **options)

    async def check_server(
        self, conninfo: str, connect_timeout: float, setting_names: SettingNames
    ) -> None:
        # After the lock session connected: a transaction pooler gets its own, clearer refusal.
        await check_advisory_locks(
            lambda: open_probe_session(conninfo, connect_timeout),
            lease_setting=setting_names.lease,
        )

    async def claim(
        self,
        unique: Sequence[ClaimRequest],
        keys: Sequence[int],
        tokens: Sequence[UUID],
        replica: str,
    ) -> Won:
        rows = await self._statements.fetch(
            "claim",
            retry=True,  # the token makes a retry recognise the rows its first try inserted
            jobs=[r.job for r in unique],
            ticks=[r.scheduled_at for r in unique],
            keys=list(keys),
            locks=[r.lock for r in unique],
            manual=[r.manual for r in unique],
            limits=[r.max_runs for r in unique],
            replica=replica,
            tokens=tokens,
            ahead=CLAIM_AHEAD,
            stale_after=self._stale_after,
        )
        claimed = [ClaimRow(*row) for row in rows]
        if any(row.status == "moved" for row in claimed):
            refuse_pooler(self._statements, replica)
        return {(row.job, row.tick.astimezone(UTC)): (row, 0) for row in claimed}

    async def lock(self, claim: Claim, key: int, epoch: int | None, replica: str) -> bool:
        [(locked,)] = await self._statements.fetch(
            "lock", key=key, job=claim.job, run_id=claim.run_id, stale_after=self._stale_after
        )
        if locked is None:
            refuse_pooler(self._statements, replica)
        return bool(locked)

    def locks_survive(self, session: LockSession, generation: int) -> bool:
        return session.connected and session.generation == generation

    async def release(
        self,
        params: dict[str, Any],
        unlocking: Sequence[tuple[int, RunRecord]],
        generation: int,
        replica: str,
    ) -> tuple[Sequence[bool], Sequence[str | None]]:
        [(written, found, unlocked)] = await self._statements.fetch(
            "release",
            retry=True,  # written by run id, never over another outcome: idempotent
            **params,
        )
        session = self._statements.session
        if session is not None and session.generation != generation:
            return written, found  # retried on a new session: the locks had died with the old
        if None in unlocked:
            refuse_pooler(self._statements, replica)
        for (key, record), released in zip(unlocking, unlocked, strict=False):
            if released is False:
                logger.error(
                    "job %r: advisory lock %s was not held at unlock",
                    record.job,
                    key,
                    extra={"event": "lock_error", "job": record.job, "replica": replica},
                )
        return written, found

    async def heartbeat(self, runs: HeldRuns, run_ids: Sequence[int], **params: Any) -> Beat:
        [(ours, db_now, refreshed, held, peers, *leader)] = await self._statements.fetch(
            "heartbeat", run_ids=run_ids, **params
        )
        if not ours:  # it ran on another server session than the lock session's
            refuse_pooler(self._statements, params["replica"])
        present = signed(held)

        def lost(unrefreshed: set[int]) -> list[int]:
            # A locked run whose lock is gone from pg_locks, or whose row was not refreshed.
            return runs.locks.missing(present, unrefreshed)

        sent_at = self._statements.sent_at()
        return Beat(db_now, peers, (leader[0], leader[1]), None, refreshed, sent_at, lost)

    async def abandon_stale(self, stale_after: timedelta) -> list[Any]:
        return await self._statements.fetch("abandon_stale", retry=True, stale_after=stale_after)

    def deadline_passed(self) -> None:
        # Every lock of the session goes with it: none outlives the run that must stop
        # (nor, so, do the others' locks: their runs are told to stop by the lost session).
        self._statements.invalidate()

    async def free_locks(self, run_ids: Sequence[int], replica: str) -> None:
        """Closing the session frees them."""


def signed(keys: Iterable[int]) -> frozenset[int]:
    """Advisory lock keys as ``pg_locks`` reads them (unsigned) as the signed bigints they
    were taken as."""
    return frozenset((key - (1 << 64)) if key >= 1 << 63 else key for key in keys)


def refuse_pooler(statements: Statements, replica_id: str) -> NoReturn:
    """A statement ran on another server session than the lock session's: a transaction
    pooler is in between. Nothing was locked or unlocked there; the session is given up, and
    every later statement is refused: coordination through it cannot be trusted."""
    names = statements.session.setting_names if statements.session else PYTHON_NAMES
    refusal = TransactionPoolerError(
        "a statement of the lock session ran on another server session: the connection "
        "goes through a transaction pooler, where session advisory locks do not hold; "
        f"this replica coordinates nothing more. {names.behind_a_pooler()}."
    )
    statements.refuse(refusal)
    logger.error("%s", refusal, extra={"event": "lock_error", "replica": replica_id})
    raise refusal
