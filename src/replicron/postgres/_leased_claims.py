"""Lease mode's claims, as methods of :class:`PostgresBackend`: the ticks another replica
already has are answered from one read, the others claimed in one statement."""

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

    @property
    def peers(self) -> frozenset[str]:
        raise NotImplementedError  # the backend's

    def clock_offset(self) -> timedelta | None:
        raise NotImplementedError  # the backend's

    def lock_key(self, job: str) -> int:
        raise NotImplementedError  # the backend's

    def _journal_claim(self, job: str, tick: datetime, run_id: int, manual: bool) -> None:
        raise NotImplementedError  # the backend's

    async def _fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        raise NotImplementedError  # the backend's: on its session

    async def _claim_leased(self, unique: Sequence[ClaimRequest]) -> list[Claim]:
        """Lease mode: the ticks another replica has already are answered from one read, then
        the others claimed; each won row comes with the epoch this replica holds it in."""
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        answers = [taken_repeat(request) for request in unique]
        had = await self._rows_of_others(unique, ticks)
        trying = [n for n in range(len(unique)) if n not in had]
        if not trying:
            return answers
        with self._tokens.attempt([ticks[n] for n in trying]) as tokens:
            rows = await self._fetch(
                "lease_claim",
                retry=True,  # the token makes a retry recognise the rows its first try inserted
                jobs=[unique[n].job for n in trying],
                ticks=[unique[n].scheduled_at for n in trying],
                locks=[unique[n].lock for n in trying],
                manual=[unique[n].manual for n in trying],
                limits=[unique[n].max_runs for n in trying],
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
        for n in trying:
            found = won.get(ticks[n])
            if found is None:  # somebody has it
                continue
            row, epoch = found
            if row.opened is not None:
                self._runs.claimed(row.opened, epoch)
                self._journal_claim(row.job, ticks[n][1], row.opened, unique[n].manual)
            if row.locked_run is not None:
                self._runs.locked(self.lock_key(unique[n].job), row.locked_run, sent)
            answers[n] = row.claim(unique[n])
        return answers

    async def _rows_of_others(
        self, unique: Sequence[ClaimRequest], ticks: Sequence[tuple[str, datetime]]
    ) -> set[int]:
        """Lease mode, among peers: which of the ticks whose instant has come already have a
        row (their first replica claimed them ahead), read once instead of tried one by one.
        A tick whose claim's answer this replica lost is tried again, never read."""
        if len(self.peers) < 2:
            return set()
        offset = self.clock_offset() or timedelta(0)
        now = datetime.now(UTC) + offset
        due = [
            n
            for n, request in enumerate(unique)
            if not request.manual and request.scheduled_at <= now and ticks[n] not in self._tokens
        ]
        if not due:
            return set()
        rows = await self._fetch(
            "lease_unclaimed",
            retry=True,
            jobs=[ticks[n][0] for n in due],
            ticks=[ticks[n][1] for n in due],
        )
        free = {due[position - 1] for (position,) in rows}
        return set(due) - free
