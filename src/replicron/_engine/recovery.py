"""Ticks that fell due while nothing handled them: missed while no replica was up (caught
up on start), or unhandled while the backend was unreachable (resynced once it answers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

from replicron.backends.base import Backend
from replicron.triggers import FixedDelayTrigger

from .health import CATCHING_UP, CLAIMING, RECORDING_MISSED
from .observe import Observer
from .planner import Span, Tick, catch_up_plan, resync_plan, walk
from .recorder import Recorder
from .registry import JobRegistry
from .retries import Retries

__all__ = ["Recovery"]

_INFO, _ERROR = logging.INFO, logging.ERROR


class Recovery:
    """Each job's ``catch_up`` and ``misfire_grace`` decide which of those ticks run and
    which are recorded missed (see ``catch_up_plan`` and ``resync_plan``)."""

    def __init__(
        self,
        *,
        backend: Backend,
        registry: JobRegistry,
        recorder: Recorder,
        retries: Retries,
        observer: Observer,
        queue_backlogs: Callable[[Mapping[str, list[datetime]]], Awaitable[None]],
    ) -> None:
        self._backend, self._registry, self._recorder = backend, registry, recorder
        self._retries, self._observer = retries, observer
        #: Claims each job's backlog (the ticks to run, oldest first) and queues its runs.
        self._queue_backlogs = queue_backlogs

    async def record_missed(self, ticks: list[Tick], older: Mapping[str, Span], why: str) -> int:
        """Record ``ticks`` missed, and each job's span in ``older`` as one record; those not
        yet due by the backend's clock are retried. Returns how many ticks were recorded."""
        recorded, early = await self._recorder.record_missed(ticks, older, why)
        now = self._registry.clock.now()
        for tick in early:
            self._retries.early(tick, now)
        return recorded

    async def catch_up(
        self, names: list[str], now: datetime, since: Mapping[str, datetime] | None = None
    ) -> list[Tick]:
        """Ticks of ``names`` missed since each one's last recorded tick (or, for a job with
        none, since its instant in ``since``): returns the one tick to run now of each job
        that has one; claims a backlog of several (``catch_up="all"``) at once, to run one
        after another; records the others missed. The misses are recorded before the
        backlog is claimed: if claiming fails, the job's latest record is still older than
        its backlog, and the next try finds the backlog again."""
        runs: list[Tick] = []
        backlogs: dict[str, list[datetime]] = {}
        missed: list[Tick] = []
        older: dict[str, Span] = {}
        lasts = await self._backend.last_ticks(names)
        self._recorder.health.answered(CATCHING_UP)
        for name in names:
            state, last = self._registry.get(name), lasts.get(name)
            if last is None and since:
                last = since.get(name)
            # A fixed-delay job has one tick at a time, planned from its last finish: a
            # stale one runs once, late (or is missed past misfire_grace), never replayed.
            if state is None or last is None or isinstance(state.spec.trigger, FixedDelayTrigger):
                continue
            spec = state.spec
            due, skipped, span = catch_up_plan(
                spec.trigger, last, now, spec.catch_up, spec.misfire_grace
            )
            # Catch-up runs go one after another, whatever the overlap policy.
            if len(due) > 1:
                backlogs[name] = due
            elif due:
                runs.append(Tick(name, due[0]))
            missed += [Tick(name, t) for t in skipped]
            if span is not None:
                older[name] = span
        if missed or older:
            why = "no replica ran it when it fell due (caught up on start)"
            await self.record_missed(missed, older, why)
        if backlogs:
            await self._queue_backlogs(backlogs)
        return runs

    async def resync(self, now: datetime, due_now: set[str]) -> list[Tick]:
        """Ticks whose handling failed, now that the backend may answer: handled like ticks
        missed while no replica was up (see ``resync_plan``)."""
        unhandled = self._retries.take_unhandled()
        runs: list[Tick] = []
        backlogs: dict[str, list[datetime]] = {}
        missed: list[Tick] = []
        older: dict[str, Span] = {}
        for name, (first, last) in unhandled.items():
            state = self._registry.get(name)
            if state is None:
                continue
            spec = state.spec
            run, skip, span = resync_plan(
                spec.trigger,
                first,
                last,
                now,
                spec.catch_up,
                spec.misfire_grace,
                superseded=name in due_now,
            )
            if len(run) > 1:
                backlogs[name] = run
            elif run:
                runs.append(Tick(name, run[0]))
            missed += [Tick(name, tick) for tick in skip]
            if span is not None:
                older[name] = span
        count = 0
        if missed or older:
            why = "the backend was unreachable when it fell due"
            try:
                count = await self.record_missed(missed, older, why)
            except Exception as exc:
                self._recorder.lock_error(missed, exc, RECORDING_MISSED)
                spans = [Tick(name, span.first) for name, span in older.items()]
                self._retries.unhandle(spans + missed + runs + _ticks_of(backlogs), now)
                return []
        if backlogs:
            try:
                await self._queue_backlogs(backlogs)
            except Exception as exc:
                self._recorder.lock_error(_ticks_of(backlogs), exc, CLAIMING)
                self._retries.unhandle(_ticks_of(backlogs), now)
        # Said once the backend has answered (the misses are recorded): until then each
        # retry would say it again. The count is what this replica wrote: ticks that already
        # had records (another replica's, a claim whose answer was lost) are not in it.
        if missed or older:
            to_run = len(runs) + sum(len(ticks) for ticks in backlogs.values())
            self._observer.log(
                _INFO,
                "resync",
                f"ticks that fell due while the backend was unavailable: {to_run} to run, "
                f"{count} recorded missed (by each job's catch_up and misfire_grace)",
            )
        return runs

    async def record_unhandled_at_stop(self, limit: float) -> None:
        """Ticks whose handling failed with the backend, at shutdown: recorded missed if the
        backend answers within ``limit`` seconds, else named in an ERROR record."""
        unhandled = self._retries.take_unhandled()
        ticks: list[Tick] = []
        older: dict[str, Span] = {}
        for name, (first, last) in unhandled.items():
            if (state := self._registry.get(name)) is None:
                continue
            walked = walk(state.spec.trigger, first, last)
            ticks += [Tick(name, tick) for tick in walked.listed]
            if walked.older is not None:
                older[name] = walked.older
        why = "the backend was unreachable when it fell due, and the scheduler shut down"
        try:
            await asyncio.wait_for(self._recorder.record_missed(ticks, older, why), limit)
        except Exception as exc:
            listed = ", ".join(f"{job}@{tick.isoformat()}" for job, tick in ticks)
            self._observer.log(
                _ERROR,
                "lock_error",
                f"could not record {len(ticks)} unhandled ticks as "
                f"missed before shutting down ({exc!r}): {listed}",
            )


def _ticks_of(backlogs: Mapping[str, list[datetime]]) -> list[Tick]:
    return [Tick(name, tick) for name, ticks in backlogs.items() for tick in ticks]
