"""How runs and ticks ended: logged, told to listeners, kept as each job's latest outcome, and
written to the backend in batches."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from replicron.backends.base import Backend, Claim, Release, RunRecord, pack_record
from replicron.events import Outcome, RunEvent

from .background import Background
from .health import RECORDING_MISSED, BackendHealth, is_outage
from .lifecycle import Lifecycle
from .observe import Observer
from .planner import Span, Tick, span_starts
from .registry import JobRegistry, JobState, event_of

__all__ = ["MissedRecorded", "Recorder"]

_DEBUG, _INFO, _WARNING, _ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
_LOG_LEVEL = {
    Outcome.SUCCEEDED: _DEBUG,
    Outcome.FAILED: _ERROR,
    Outcome.SKIPPED_OVERLAP: _INFO,
    Outcome.TIMED_OUT: _WARNING,
    Outcome.SKIPPED_LIMIT: _WARNING,
    Outcome.MISSED: _WARNING,
    Outcome.ABANDONED: _WARNING,
    Outcome.PAUSED: _DEBUG,  # every tick of a paused job: it was paused on purpose
}
_LISTENER_HOOK = {
    Outcome.SUCCEEDED: "after_success",
    Outcome.FAILED: "after_failure",
    Outcome.TIMED_OUT: "on_timeout",
    Outcome.SKIPPED_OVERLAP: "on_skipped",
    Outcome.SKIPPED_LIMIT: "on_skipped",
    Outcome.MISSED: "on_missed",
    Outcome.ABANDONED: "on_abandoned",
    Outcome.PAUSED: "on_skipped",
}
#: Called with the jobs whose outcomes were just written (None where the outcome was not a
#: run's), once they are: what waited for them may start.
AfterRelease = Callable[[Sequence[JobState | None]], Awaitable[None]]


async def _nothing_waits(states: Sequence[JobState | None]) -> None:
    return None


def _first_tick(record: RunRecord) -> datetime:
    return record.scheduled_at


def _last_tick(record: RunRecord) -> datetime:
    return record.scheduled_at if record.through is None else record.through


class MissedRecorded(NamedTuple):
    """What ``Recorder.record_missed`` did: how many ticks it recorded missed (a range by
    the ticks its row stands for), and the ticks the backend found not yet due."""

    recorded: int
    early: list[Tick]


class Recorder:
    """Outcomes go out in batches: while one batch is written, the next one gathers. A run's
    lock is released with its outcome, after it is written (see ``Backend.release``)."""

    def __init__(
        self,
        *,
        backend: Backend,
        registry: JobRegistry,
        observer: Observer,
        background: Background,
        life: Lifecycle,
        replica_id: str,
        health: BackendHealth,
    ) -> None:
        self._backend, self._registry, self._observer = backend, registry, observer
        #: Whether the backend answers: told of every call here that reaches a verdict.
        self.health = health
        self._background, self._life, self.replica_id = background, life, replica_id
        self._releases: list[Release] = []
        self._released_states: list[JobState | None] = []
        self._written: list[Callable[[], None]] = []
        self.after_release: AfterRelease = _nothing_waits

    def __bool__(self) -> bool:
        """Whether outcomes wait to be written."""
        return bool(self._releases)

    def record(
        self,
        state: JobState,
        claim: Claim,
        outcome: Outcome,
        detail: str,
        unlock: bool = False,
        *,
        then_next: bool = False,
    ) -> None:
        """A claimed tick that did not run (skipped, missed, ...); ``then_next``: it was its
        job's turn, so what waits behind it (a catch-up backlog) is started once recorded.
        Its finish is when it was recorded: a fixed-delay job's next tick follows it."""
        record = RunRecord(
            state.spec.name,
            claim.scheduled_at,
            outcome,
            self.replica_id,
            claim.run_id,
            None,
            self._registry.clock.now(),
            detail,
            claim.manual,
        )
        self.report(record, state, detail=detail)
        self.release(record, unlock, state if then_next else None)

    def record_claims_missed(self, state: JobState, claims: list[Claim], why: str) -> None:
        """Claimed ticks of one job that will not run (a catch-up backlog at shutdown),
        recorded missed: one WARNING however many, each told to the listeners."""
        now = self._registry.clock.now()
        records = [
            RunRecord(
                state.spec.name,
                claim.scheduled_at,
                Outcome.MISSED,
                self.replica_id,
                claim.run_id,
                None,
                now,
                why,
            )
            for claim in claims
        ]
        for record in records:
            self.release(record, False, None)
        self._report_missed(records, why)

    def report(
        self,
        record: RunRecord,
        state: JobState | None,
        *,
        error: BaseException | None = None,
        detail: str | None = None,
        announced: bool = False,
    ) -> None:
        """Log the outcome, tell the listeners, keep it as the job's latest. ``announced``:
        the outcome was logged and told when it happened (a timeout, at its deadline), so
        here it is only noted (INFO, no second listener call): one WARNING per event."""
        if state is not None:
            state.last_record = pack_record(record)
            state.last_error, state.last_detail = error, detail
        outcome = record.outcome
        observer = self._observer
        level = _INFO if announced else _LOG_LEVEL[outcome]
        if observer.enabled(level):
            if outcome is Outcome.FAILED:
                message = f"run failed: {record.error}"
            elif outcome is Outcome.SUCCEEDED:
                message = f"run succeeded in {record.finished_at - record.started_at}"  # type: ignore[operator]
            else:
                message = f"{outcome.value}" + (f": {detail}" if detail else "")
            if record.manual:
                message = f"manual {message}"
            observer.log(
                level, outcome.value, message, record.job, record.scheduled_at, record.run_id, error
            )
        if observer.listeners and not announced:
            observer.notify(_LISTENER_HOOK[outcome], event_of(record, error, detail))

    def release(
        self,
        record: RunRecord,
        unlock: bool,
        state: JobState | None,
        written: Callable[[], None] | None = None,
    ) -> None:
        """Write ``record`` with the next batch, then release its lock if ``unlock``; then
        call ``written`` (written or not: the backend answered) and tell ``after_release``
        about ``state``."""
        releases = self._releases
        releases.append(Release(record, unlock))
        self._released_states.append(state)
        if written is not None:
            self._written.append(written)
        if len(releases) == 1:
            self._background.spawn(self.flush())

    async def flush(self) -> None:
        while self._releases:
            batch, self._releases = self._releases, []
            states, self._released_states = self._released_states, []
            written, self._written = self._written, []
            try:
                # Returning proves nothing: a backend may keep outcomes to write them later.
                await self._backend.release(batch)
            except Exception as exc:
                self.health.failed(exc, "recording outcomes", retried=False)
                # The backend's outage is said once; which outcomes it lost, each time.
                trace = None if is_outage(exc) else exc
                for record, _ in batch:
                    self._observer.log(
                        _ERROR,
                        "lock_error",
                        f"could not record {record.outcome}: {exc!r}",
                        record.job,
                        record.scheduled_at,
                        record.run_id,
                        trace,
                    )
            for call in written:
                call()
            if self._life.running:  # once stopping, nothing more starts
                await self.after_release(states)

    async def record_missed(
        self, ticks: list[Tick], older: Mapping[str, Span], why: str = "a later tick was due"
    ) -> MissedRecorded:
        """Record ``ticks`` missed, where no replica has them, and each job's span in
        ``older`` as one record (before the ticks: a tick inside a range recorded meanwhile
        by another replica is then refused). A span's ticks that already have records keep
        them: its range stands for the others. Logs one WARNING per job, however many ticks.
        Returns how many ticks were recorded, and those the backend found not yet due by its
        clock (ours runs ahead): they are to be claimed shortly."""
        missed, replica, registry = Outcome.MISSED, self.replica_id, self._registry
        now = registry.clock.now()
        recorded: dict[str, list[RunRecord]] = {}
        if older:
            spans: list[RunRecord] = []
            for job, span in older.items():
                state = registry.get(job)
                starts = () if state is None else span_starts(state.spec.trigger, span)
                record = RunRecord(job, span.first, missed, replica, None, None, now, why)
                spans.append(record._replace(through=span.last, ticks=span.ticks, starts=starts))
            answers = await self._backend.record_unclaimed(spans)
            self.health.answered(RECORDING_MISSED)
            for record, written in zip(spans, answers, strict=True):
                if written:  # the ticks of the span without records of their own
                    recorded.setdefault(record.job, []).append(record._replace(ticks=written))
                else:  # another replica recorded a range in that span: the ticks are its
                    self._observer.log(
                        _DEBUG,
                        "missed",
                        f"{record.ticks} missed ticks from "
                        f"{record.scheduled_at.isoformat()} already have records",
                        record.job,
                        record.scheduled_at,
                    )
        records = [
            RunRecord(
                t.job,
                t.scheduled_at,
                missed,
                replica,
                None,
                None,
                now,
                why,
                False,
                None if (state := registry.get(t.job)) is None else state.spec.max_runs,
            )
            for t in ticks
        ]
        early: list[Tick] = []
        if records:
            answers = await self._backend.record_unclaimed(records)
            self.health.answered(RECORDING_MISSED)
            for record, ours in zip(records, answers, strict=True):
                if ours:
                    recorded.setdefault(record.job, []).append(record)
                elif ours is None:
                    early.append(Tick(record.job, record.scheduled_at))
        for job_records in recorded.values():
            self._report_missed(job_records, why)
        count = sum(record.ticks for job_records in recorded.values() for record in job_records)
        return MissedRecorded(count, early)

    def _report_missed(self, records: list[RunRecord], why: str) -> None:
        """One job's missed ticks just recorded: one WARNING however many they are, and
        each record told to the listeners (a range as one event, with its count)."""
        if len(records) == 1 and records[0].through is None:
            self.report(records[0], self._registry.get(records[0].job), detail=why)
            return
        first = min(records, key=_first_tick)
        latest = max(records, key=_last_tick)
        state = self._registry.get(first.job)
        if state is not None:
            state.last_record = pack_record(latest)
            state.last_error, state.last_detail = None, why
        count = sum(record.ticks for record in records)
        self._observer.log(
            _WARNING,
            Outcome.MISSED.value,
            f"{count} ticks missed, from this one through {_last_tick(latest).isoformat()}: {why}",
            first.job,
            first.scheduled_at,
        )
        if self._observer.listeners:
            for record in records:
                self._observer.notify("on_missed", event_of(record, None, why))

    def lock_error(self, ticks: list[Tick], exc: Exception, doing: str) -> None:
        """The backend failed while ``doing`` something with ``ticks``: said by the health
        (once for an outage), told to the listeners for each tick."""
        self.health.failed(exc, doing)
        if self._observer.listeners:
            for tick in ticks:
                event = RunEvent(tick.job, tick.scheduled_at, self.replica_id, error=exc)
                self._observer.notify("on_lock_error", event)
