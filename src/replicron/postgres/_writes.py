"""How runs ended, written to the ledger: outcomes with the unlocks of their runs in one round
trip (kept and written later when the server cannot be reached), ticks recorded without a run,
and what the backend says of a write that did not simply record a first outcome."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC

from replicron.backends.base import (
    Release,
    RunRecord,
    answer_each,
    once_per_tick,
    unrecorded_repeat,
)

from ._claims import CLAIM_AHEAD
from ._coordination import Coordination
from ._housekeeping import Housekeeper
from ._session import BackendUnavailableError, TransactionPoolerError
from ._statements import Statements
from ._tokens import ClaimTokens

__all__ = ["OutcomeWrites", "log_unwritten", "log_write"]

logger = logging.getLogger("replicron.postgres.backend")  # the backend's, as documented


def _extra(record: RunRecord, replica: str) -> dict[str, str]:
    return {
        "event": "lock_error",
        "job": record.job,
        "tick": record.scheduled_at.isoformat(),
        "replica": replica,
    }


def log_write(record: RunRecord, written: bool, before: str | None, replica: str) -> None:
    """Say what an outcome write did when it was not simply the first outcome of its row."""
    extra = _extra(record, replica)
    outcome = record.outcome.value
    if written and before == "abandoned" and outcome != "abandoned":
        logger.warning(
            "job %r tick %s: replaced %r (written by a janitor while the run went on) with %r",
            record.job,
            record.scheduled_at.isoformat(),
            before,
            outcome,
            extra=extra,
        )
    elif not written and before == outcome:
        # Lease mode: a janitor wrote off a run whose lease had ended, in a newer epoch, and
        # the run, fenced by the same lease, says the same.
        logger.info(
            "job %r tick %s: already recorded %r",
            record.job,
            record.scheduled_at.isoformat(),
            outcome,
            extra=extra,
        )
    elif not written:
        logger.error(
            "job %r tick %s: outcome %r not written: %s",
            record.job,
            record.scheduled_at.isoformat(),
            outcome,
            "no row of this replica" if before is None else f"the row already says {before!r}",
            extra=extra,
        )


def log_unwritten(record: RunRecord, replica: str) -> None:
    """At shutdown, an outcome that could not be written: said at ERROR with its tick."""
    logger.error(
        "job %r tick %s: could not record %s (run %s): the database is unreachable; the row "
        "goes stale and a janitor records it abandoned",
        record.job,
        record.scheduled_at.isoformat(),
        record.outcome.value,
        record.run_id,
        extra=_extra(record, replica),
    )


class OutcomeWrites:
    """The backend's writes to the ledger once a tick's claim is over: outcomes, ticks
    nobody ran, ranges of missed ticks; through ``statements`` and the mode's
    ``coordination``, for the runs ``housekeeper`` holds. ``unreachable`` says whether the
    server could not be reached a moment ago."""

    def __init__(
        self,
        statements: Statements,
        coordination: Coordination,
        housekeeper: Housekeeper,
        tokens: ClaimTokens,
        *,
        lock_key: Callable[[str], int],
        unreachable: Callable[[], bool],
    ) -> None:
        self._statements = statements
        self._coordination = coordination
        self._housekeeper = housekeeper
        self._runs = housekeeper.runs
        self._tokens = tokens
        self._lock_key = lock_key
        self._unreachable = unreachable
        #: Outcomes whose write failed, oldest first.
        self.unwritten: list[Release] = []
        #: The epoch each outcome waiting to be written names, by run id (row lease fences
        #: a holder's writes by it; advisory keeps it 0).
        self._epochs: dict[int, int | None] = {}

    @property
    def replica_id(self) -> str:
        return self._housekeeper.replica_id

    async def release(self, releases: Sequence[Release]) -> None:
        """Record the outcomes (and drop the locks); an outcome that cannot be written now is
        kept and written with the next release or heartbeat, on a new session if need be."""
        for release in releases:  # each write names the epoch its run held
            if (run_id := release.record.run_id) is not None:
                self._epochs[run_id] = self._runs.epoch_of(run_id)
        self._runs.finished(r.record.run_id for r in releases if r.record.run_id is not None)
        if self._unreachable():
            # The server could not be reached a moment ago: the housekeeper writes these with
            # its next heartbeat, so a shutdown never waits on one more failing reconnect.
            # Whether the locks are still held to be unlocked is the mode's to say.
            session = self._statements.session
            survive = session is not None and self._coordination.locks_survive(
                session, session.generation
            )
            self.unwritten += [Release(r.record, survive and r.unlock) for r in releases]
            return
        try:
            await self._write_outcomes(releases)
        except BackendUnavailableError as exc:  # kept: the scheduler says the database is gone
            logger.debug(
                "%d outcomes wait to be written (%s); retrying on a new session",
                len(self.unwritten),
                exc,
                extra={"event": "lock_error", "replica": self.replica_id},
            )

    async def write_pending(self) -> None:
        """Write the outcomes whose write failed before, on a new session if need be."""
        if self.unwritten:
            await self._write_outcomes([])

    async def _write_outcomes(self, releases: Sequence[Release]) -> None:
        batch = self.unwritten + list(releases)
        self.unwritten = []
        unlocking: list[tuple[int, RunRecord]] = []  # the locks this batch unlocks
        for record, unlock in batch:
            key = self._lock_key(record.job)
            if unlock and self._runs.locks.take(key, record.run_id):
                unlocking.append((key, record))
        records = [release.record for release in batch]
        session = self._statements.session
        assert session is not None
        generation = session.generation
        epochs = self._epochs
        try:
            written, found = await self._coordination.release(
                {
                    "run_ids": [r.run_id for r in records],
                    "jobs": [r.job for r in records],
                    "ticks": [r.scheduled_at for r in records],
                    "outcomes": [r.outcome.value for r in records],
                    "started": [r.started_at for r in records],
                    "finished": [r.finished_at for r in records],
                    "errors": [r.error for r in records],
                    "epochs": [None if r.run_id is None else epochs.get(r.run_id) for r in records],
                    "replica": self.replica_id,
                    "unlock_keys": [key for key, _ in unlocking],
                    "unlock_runs": [record.run_id for _, record in unlocking],
                },
                unlocking,
                generation,
                self.replica_id,
            )
        except TransactionPoolerError:
            # The statement ran, on another server session: the outcomes are written, there
            # is nothing to keep, and nothing is coordinated through this backend any more.
            for record in records:
                if record.run_id is not None:
                    epochs.pop(record.run_id, None)
            raise
        except BaseException:  # nothing known written: every outcome of the batch is kept
            # The statement was rolled back: the locks it was to unlock are held still if
            # they outlive what happened to the session meanwhile (lock rows always do).
            kept = self._coordination.locks_survive(session, generation)
            if kept:
                for key, record in unlocking:
                    self._runs.locks.give_back(key, record.run_id)
            unlocked_records = [record for _, record in unlocking]
            self.unwritten = [
                Release(record, kept and record in unlocked_records) for record in records
            ] + self.unwritten
            raise
        for record in records:
            if record.run_id is not None:
                epochs.pop(record.run_id, None)
        journal = self._housekeeper.server.journal  # put back after a failover if need be
        for record, ok, before in zip(records, written, found, strict=True):
            log_write(record, ok, before, self.replica_id)
            if ok:
                journal.ended(record)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        await self._housekeeper.admit()
        if any(record.through is not None for record in records):
            return await self._record_ranges(records)
        unique, where = once_per_tick(records)  # a record listed twice is recorded once
        ticks = [(r.job, r.scheduled_at.astimezone(UTC)) for r in unique]
        with self._tokens.attempt(ticks) as tokens:
            rows = await self._statements.fetch(
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
            )
        found = {(job, tick.astimezone(UTC)): what for job, tick, what in rows}
        # Per tick: "recorded", "early" (not yet due by the database's clock, ask again), or
        # something else or nothing (somebody has it): not recorded.
        answers: list[int | None] = [
            None if (what := found.get(key)) == "early" else what == "recorded" for key in ticks
        ]
        for record, answer in zip(unique, answers, strict=True):
            if answer:
                self._housekeeper.server.journal.ended(record)
        return answer_each(records, answers, where, unrecorded_repeat)

    async def _record_ranges(self, records: Sequence[RunRecord]) -> list[int | None]:
        """Ranges of missed ticks, each in one row, in a statement of their own before the
        ticks' own records (those inside a range just recorded are then refused)."""
        ranges = [r for r in records if r.through is not None]
        starts = [
            (place, start)
            for place, r in enumerate(ranges, 1)
            for start in r.starts or (r.scheduled_at,)
        ]
        rows = await self._statements.fetch(
            "record_missed_ranges",
            retry=True,  # a first try's range, found in the span, refuses the retry's
            jobs=[r.job for r in ranges],
            firsts=[r.scheduled_at for r in ranges],
            lasts=[r.through for r in ranges],
            counts=[r.ticks for r in ranges],
            errors=[r.error for r in ranges],
            starts_of=[place for place, _ in starts],
            starts=[start for _, start in starts],
            replica=self.replica_id,
        )
        written: dict[int, int] = dict(rows)
        # This replica's claims in a span whose answers were lost: their rows (if the claims
        # were committed) are those ticks' records, none of the range's. Recorded missed
        # with it, by their tokens, rather than left open for a janitor to call abandoned.
        lost = [
            (place, r._replace(scheduled_at=tick, through=None, ticks=1, starts=()))
            for place, r in enumerate(ranges, 1)
            if r.through is not None
            for tick in self._tokens.within(r.job, r.scheduled_at, r.through)
        ]
        ticks = [r for r in records if r.through is None] + [record for _, record in lost]
        answers = await self.record_unclaimed(ticks) if ticks else []
        for (place, _), closed in zip(lost, answers[len(ticks) - len(lost) :], strict=True):
            if closed:
                written[place] = written.get(place, 0) + 1
        told = iter(answers)
        places = iter(range(1, len(ranges) + 1))
        found: list[int | None] = []
        for record in records:
            if record.through is None:
                found.append(next(told))
            else:
                found.append(written.get(next(places), False))
        return found

    async def last_writes(self) -> None:
        await self.write_pending()
        if self._tokens:  # else a janitor records their rows abandoned
            await self._close_lost_claims()

    async def _close_lost_claims(self) -> None:
        rows = await self._statements.fetch(
            "close_lost_claims",
            tokens=self._tokens.tokens(),
            jobs=self._tokens.jobs(),
        )
        for job, tick in rows:
            logger.warning(
                "job %r tick %s: its claim's answer was lost; recorded missed",
                job,
                tick.isoformat(),
                extra={
                    "event": "missed",
                    "job": job,
                    "tick": tick.isoformat(),
                    "replica": self.replica_id,
                },
            )
        self._tokens.clear()
