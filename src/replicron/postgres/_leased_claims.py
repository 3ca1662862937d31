"""Lease mode's claims, as methods of :class:`PostgresBackend`: one statement per batch, which
tries no tick another replica already has."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from replicron.backends.base import Claim, ClaimRequest, taken_repeat

from ._claims import ClaimRow
from ._runs import HeldRuns
from ._statements import Statements
from ._tokens import ClaimTokens
from ._writes import CLAIM_AHEAD

__all__ = ["LeasedClaims"]


class LeasedClaims:
    """Lease mode's claims, as methods of :class:`PostgresBackend`."""

    replica_id: str
    stale_after: float
    _runs: HeldRuns
    _statements: Statements
    _tokens: ClaimTokens

    def lock_key(self, job: str) -> int:
        raise NotImplementedError  # the backend's

    def _journal_claim(self, job: str, tick: datetime, run_id: int, manual: bool) -> None:
        raise NotImplementedError  # the backend's

    async def _fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        raise NotImplementedError  # the backend's: on its session

    async def _claim_leased(self, unique: Sequence[ClaimRequest]) -> list[Claim]:
        """Lease mode: every tick claimed in one statement, which answers the ticks another
        replica has already without trying them; each won row comes with the epoch this
        replica holds it in."""
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        with self._tokens.attempt(ticks) as tokens:
            rows = await self._fetch(
                "lease_claim",
                retry=True,  # the token makes a retry recognise the rows its first try inserted
                jobs=[r.job for r in unique],
                ticks=[r.scheduled_at for r in unique],
                locks=[r.lock for r in unique],
                manual=[r.manual for r in unique],
                limits=[r.max_runs for r in unique],
                replica=self.replica_id,
                tokens=tokens,
                ahead=CLAIM_AHEAD,
                stale_after=timedelta(seconds=self.stale_after),
            )
        sent = self._statements.sent_at()
        won = {
            (job, tick.astimezone(UTC)): (
                ClaimRow(job, tick, run_id, status, holder, False, None),
                epoch,
            )
            for job, tick, run_id, status, holder, epoch in rows
        }
        answers: list[Claim] = []
        for request, tick in zip(unique, ticks, strict=True):
            found = won.get(tick)
            if found is None:  # no row came back for it: somebody has it
                answers.append(taken_repeat(request))
                continue
            row, epoch = found
            if row.opened is not None:
                self._runs.claimed(row.opened, epoch)
                self._journal_claim(row.job, tick[1], row.opened, request.manual)
            if row.locked_run is not None:
                self._runs.locked(self.lock_key(request.job), row.locked_run, sent)
            answers.append(row.claim(request))
        return answers
