"""Runs: starting them, the worker threads, timeouts, and recording how they ended.

The engine's hot path, kept apart from its loop and life cycle (``engine.py``). A burst of
runs is started on the loop, handed to the workers together, and finished in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from replicron.backends.base import Claim, Release, RunRecord, pack_record
from replicron.context import RunContext, _current
from replicron.events import Outcome, RunEvent

from .collector import HOLD_LIMIT, CollectorHold
from .observe import Observer
from .planner import Tick
from .registry import JobRegistry, JobState, event_of
from .workers import STUCK_AFTER, WorkerPool

__all__ = ["Run", "RunExecutor"]

_INFO, _DEBUG, _WARNING, _ERROR = logging.INFO, logging.DEBUG, logging.WARNING, logging.ERROR
#: Runs handed to the workers at once within a burst.
_SUBMIT_CHUNK = 256
_LOG_LEVEL = {
    Outcome.SUCCEEDED: _DEBUG,
    Outcome.FAILED: _ERROR,
    Outcome.SKIPPED_OVERLAP: _INFO,
    Outcome.TIMED_OUT: _WARNING,
    Outcome.SKIPPED_LIMIT: _WARNING,
    Outcome.MISSED: _WARNING,
    Outcome.ABANDONED: _WARNING,
}
_LISTENER_HOOK = {
    Outcome.SUCCEEDED: "after_success",
    Outcome.FAILED: "after_failure",
    Outcome.TIMED_OUT: "on_timeout",
    Outcome.SKIPPED_OVERLAP: "on_skipped",
    Outcome.SKIPPED_LIMIT: "on_skipped",
    Outcome.MISSED: "on_missed",
    Outcome.ABANDONED: "on_abandoned",
}


@dataclass(slots=True, eq=False)
class Run:
    job: JobState
    claim: Claim
    ctx: RunContext
    started_at: datetime
    timed_out: bool = False
    abandoned: bool = False
    finished: bool = False
    why: str | None = None  # what cut the run off, for the ledger
    task: asyncio.Task[None] | None = None
    # A sync run's result, handed back to the loop with the run.
    error: BaseException | None = None
    finished_at: datetime | None = None


class RunExecutor(JobRegistry):
    """Starts and finishes runs; the engine sets up the state declared here."""

    replica_id: str
    max_concurrent_jobs: int | None
    observer: Observer
    _idle: asyncio.Event | None
    _workers: WorkerPool[Run] | None
    _active: set[Run]
    _waiting: deque[tuple[JobState, Claim]]
    _deadlines: list[tuple[datetime, int, Run]]
    _seq: itertools.count[int]
    _tasks: set[asyncio.Task[Any]]
    _releases: list[tuple[RunRecord, bool, JobState | None]]
    _done: deque[Run]
    _done_wake_pending: bool
    _to_submit: list[Run]
    _supervising: bool
    _collector: CollectorHold
    _collector_limit: asyncio.TimerHandle | None
    _started_async: bool  # an async run was started since the collector was held

    def _quiet_may_have_changed(self, *_: object) -> None:
        raise NotImplementedError

    def _start(self, state: JobState, claim: Claim, now: datetime | None = None) -> None:
        # Once per run of a burst, before the burst's last run can begin: kept lean.
        spec = state.spec
        max_runs = spec.max_runs
        if max_runs is not None and state.runs_started >= max_runs:
            self._record(state, claim, Outcome.MISSED, "max_runs reached", unlock=claim.locked)
            return
        # One clock read per batch; the run's real start is taken again where it begins.
        started = self.clock.now() if now is None else now
        timeout = spec.timeout
        deadline = None if timeout is None else started + timeout
        ctx = RunContext(spec.name, claim.scheduled_at, claim.run_id, self.replica_id, deadline)
        run = Run(state, claim, ctx, started)
        state.running += 1
        state.runs_started += 1
        if max_runs is not None and state.runs_started >= max_runs:
            with self._lock:
                self._planner.remove(spec.name)
        active = self._active
        if not active:
            assert self._idle is not None
            self._idle.clear()
        active.add(run)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._seq), run))
        if self.observer.listeners:
            self.observer.notify("before_run", self._event_of(run, None, None, None))
        if spec.is_async:
            assert self._loop is not None
            run.task = self._loop.create_task(self._run_async(run))
            self._started_async = True
            return
        # Runs of one instant go to the workers together, once the loop is done with them.
        to_submit = self._to_submit
        if not to_submit:
            assert self._loop is not None
            self._loop.call_soon(self._submit_all)
        to_submit.append(run)
        if len(to_submit) >= _SUBMIT_CHUNK:  # long bursts: let the first runs begin
            self._submit_all()

    def _submit_all(self) -> None:
        works, self._to_submit = self._to_submit, []
        if works:
            assert self._workers is not None
            self._workers.submit_many(works)
            if not self._supervising:
                self._supervising = True
                self._supervise_workers()

    def _supervise_workers(self) -> None:
        """While runs wait for a thread, wake more threads if the awake ones are stuck."""
        assert self._workers is not None
        assert self._loop is not None
        if self._workers.supervise() and self._state != "stopped":
            self._loop.call_later(STUCK_AFTER, self._supervise_workers)
        else:
            self._supervising = False
            self._release_collector()  # every run of the burst has a thread

    # ---- the collector is held back while an instant's runs start (see _collector) ----

    def _hold_collector(self) -> None:
        if self._collector.take():
            self._started_async = False
            assert self._loop is not None
            self._collector_limit = self._loop.call_later(HOLD_LIMIT, self._release_collector)

    def _release_collector_once_started(self) -> None:
        """After a dispatch: sync runs still waiting for a thread keep the collector held
        until they all have one (the supervisor lets it go then). Async runs take their first
        step on this loop next, and must not take it held: blocking the loop, it would keep
        the hold's time limit from firing."""
        if self._collector.held and (self._started_async or not self._supervising):
            self._release_collector()

    def _release_collector(self) -> None:
        if self._collector_limit is not None:
            self._collector_limit.cancel()
            self._collector_limit = None
        self._collector.release()

    def _run_sync(self, run: Run) -> None:
        if run.finished:  # abandoned at shutdown before a worker got to it
            return
        run.started_at = self.clock.now()
        spec = run.job.spec
        token = _current.set(run.ctx)
        error: BaseException | None = None
        try:
            spec.func(*spec.args, **spec.kwargs)
        except BaseException as exc:  # a task must never take its worker thread down
            error = exc
        finally:
            _current.reset(token)
        run.finished_at = self.clock.now()
        run.error = error
        # Hand the result back in batches: one loop wake-up for all runs finished meanwhile.
        # No lock: deque appends are atomic, and _drain_done clears the flag before it
        # empties the deque, so a result appended meanwhile either is drained or wakes it.
        self._done.append(run)
        if self._done_wake_pending:
            return
        self._done_wake_pending = True
        loop = self._loop
        assert loop is not None
        with contextlib.suppress(RuntimeError):  # loop gone: the run was abandoned at shutdown
            loop.call_soon_threadsafe(self._drain_done)

    def _drain_done(self) -> None:
        workers = self._workers
        if workers is not None and workers.waiting and self._state == "running":
            # Runs still wait for a thread: starting them matters more than bookkeeping, so
            # leave the GIL to the workers and look again shortly (the flag stays set, so
            # finishing workers do not wake the loop meanwhile).
            assert self._loop is not None
            self._loop.call_later(STUCK_AFTER, self._drain_done)
            return
        self._done_wake_pending = False
        done, finish = self._done, self._finish
        while done:
            run = done.popleft()
            assert run.finished_at is not None
            finish(run, run.error, run.finished_at)
            run.error = None  # a run with a timeout stays referenced until its deadline

    async def _run_async(self, run: Run) -> None:
        run.started_at = self.clock.now()
        spec = run.job.spec
        _current.set(run.ctx)
        error: BaseException | None = None
        try:
            await spec.func(*spec.args, **spec.kwargs)
        except asyncio.CancelledError as exc:
            if not (run.timed_out or run.abandoned):
                error = exc
        except Exception as exc:
            error = exc
        self._finish(run, error, self.clock.now())

    def _expire(self, now: datetime) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, run = heapq.heappop(self._deadlines)
            if run.finished:
                continue
            run.timed_out = True
            run.why = f"passed its timeout of {run.job.spec.timeout}"
            run.ctx.cancel()
            if run.task is not None:
                run.task.cancel()
            spec = run.job.spec
            self.observer.log(
                _WARNING,
                "timed_out",
                f"run passed its timeout of {spec.timeout}; "
                + ("cancelled" if run.task else "signalled (cancel event set)"),
                spec.name,
                run.claim.scheduled_at,
                run.claim.run_id,
            )
            if self.observer.listeners:
                self.observer.notify(
                    "on_timeout", self._event_of(run, Outcome.TIMED_OUT, None, None)
                )

    def _lock_lost(self, run_ids: Sequence[int]) -> None:
        """The backend lost these runs' locks: they are no longer protected against overlap,
        so they are told to stop and will be recorded abandoned."""
        lost = set(run_ids)
        for run in list(self._active):
            if run.claim.run_id not in lost or run.finished:
                continue
            run.abandoned = True
            run.why = "lost its lock with the backend session"
            run.ctx.cancel()
            if run.task is not None:
                run.task.cancel()
            claim = run.claim
            error = ConnectionError("the run's lock was lost with the backend session")
            self.observer.log(
                _ERROR, "lock_lost", "lost the run's lock; the run was told to stop",
                claim.job, claim.scheduled_at, claim.run_id,
            )  # fmt: skip
            if self.observer.listeners:
                self.observer.notify("on_lock_error", self._event_of(run, None, None, error))

    def _finish(self, run: Run, error: BaseException | None, finished: datetime) -> None:
        if run.finished:
            return
        run.finished = True
        state = run.job
        state.running -= 1
        self._active.discard(run)
        claim = run.claim
        if run.abandoned:
            outcome = Outcome.ABANDONED
        elif run.timed_out:
            outcome = Outcome.TIMED_OUT
            deadline = run.ctx.deadline
            overrun = timedelta(0) if deadline is None else finished - deadline
            if run.task is None and overrun > timedelta(0):
                self.observer.log(
                    _WARNING, "overrun", f"sync run returned {overrun} after its timeout",
                    claim.job, claim.scheduled_at, claim.run_id,
                )  # fmt: skip
        else:
            outcome = Outcome.FAILED if error is not None else Outcome.SUCCEEDED
        text = run.why if error is None else f"{type(error).__name__}: {error}"
        record = RunRecord(
            claim.job, claim.scheduled_at, outcome, self.replica_id, claim.run_id,
            run.started_at, finished, text,
        )  # fmt: skip
        self._report(record, state, error=error, notify_timeout=not run.timed_out)
        self._queue_release(record, claim.locked, state)
        if not self._active:
            assert self._idle is not None
            self._idle.set()
            self._quiet_may_have_changed()

    # ---- outcomes ----------------------------------------------------------------------

    def _record(
        self, state: JobState, claim: Claim, outcome: Outcome, detail: str, unlock: bool = False
    ) -> None:
        record = RunRecord(
            state.spec.name, claim.scheduled_at, outcome, self.replica_id, claim.run_id,
            None, None, detail,
        )  # fmt: skip
        self._report(record, state, detail=detail)
        self._queue_release(record, unlock, None)

    def _report(
        self,
        record: RunRecord,
        state: JobState | None,
        *,
        error: BaseException | None = None,
        detail: str | None = None,
        notify_timeout: bool = True,
    ) -> None:
        if state is not None:
            state.last_record = pack_record(record)
            state.last_error, state.last_detail = error, detail
        outcome = record.outcome
        level = _LOG_LEVEL[outcome]
        if self.observer.enabled(level):
            if outcome is Outcome.FAILED:
                message = f"run failed: {record.error}"
            elif outcome is Outcome.SUCCEEDED:
                message = f"run succeeded in {record.finished_at - record.started_at}"  # type: ignore[operator]
            else:
                message = f"{outcome.value}" + (f": {detail}" if detail else "")
            self.observer.log(
                level, outcome.value, message, record.job, record.scheduled_at, record.run_id, error
            )
        if self.observer.listeners and (notify_timeout or outcome is not Outcome.TIMED_OUT):
            self.observer.notify(_LISTENER_HOOK[outcome], event_of(record, error, detail))

    def _notify_lock_error(self, ticks: list[Tick], exc: Exception) -> None:
        if self.observer.listeners:
            for tick in ticks:
                event = RunEvent(tick.job, tick.scheduled_at, self.replica_id, error=exc)
                self.observer.notify("on_lock_error", event)

    def _queue_release(self, record: RunRecord, unlock: bool, state: JobState | None) -> None:
        self._releases.append((record, unlock, state))
        if len(self._releases) == 1:
            self._spawn(self._flush_releases())

    async def _flush_releases(self) -> None:
        while self._releases:
            batch, self._releases = self._releases, []
            try:
                await self.backend.release([Release(record, unlock) for record, unlock, _ in batch])
            except Exception as exc:
                for record, _, _ in batch:
                    self.observer.log(
                        _ERROR, "lock_error", f"could not record {record.outcome}: {exc!r}",
                        record.job, record.scheduled_at, record.run_id, exc,
                    )  # fmt: skip
            if self._state != "running":
                continue
            for _, _, state in batch:
                if state is not None and (state.pending or state.backlog) and not state.running:
                    await self._start_queued(state)
            self._start_waiting_for_a_slot()

    async def _start_queued(self, finished: JobState) -> None:
        """After a run of ``finished`` ended: its queued tick or its next catch-up tick."""
        pending = finished.pending
        if pending is not None:
            finished.pending = None
            try:
                locked = finished.spec.overlap == "allow" or await self.backend.lock(pending)
            except Exception as exc:
                self._record(finished, pending, Outcome.MISSED, f"could not take its lock: {exc}")
            else:
                if not locked:
                    self._record(finished, pending, Outcome.SKIPPED_OVERLAP, "running elsewhere")
                else:
                    self._start(finished, pending._replace(locked=finished.spec.overlap != "allow"))
        if finished.backlog and not finished.running:
            with self._lock:
                self._immediate.append(Tick(finished.spec.name, finished.backlog.popleft()))
            self._poke()

    def _start_waiting_for_a_slot(self) -> None:
        limit = self.max_concurrent_jobs
        while self._waiting and (limit is None or len(self._active) < limit):
            state, claim = self._waiting.popleft()
            self._start(state, claim)

    def _event_of(
        self, run: Run, outcome: Outcome | None, finished: datetime | None,
        error: BaseException | None,
    ) -> RunEvent:  # fmt: skip
        claim = run.claim
        return RunEvent(
            claim.job, claim.scheduled_at, self.replica_id, claim.run_id, outcome,
            run.started_at, finished, error,
        )  # fmt: skip

    def _spawn(self, awaitable: Awaitable[Any]) -> None:
        assert self._loop is not None
        task: asyncio.Task[Any] = asyncio.ensure_future(awaitable, loop=self._loop)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._quiet_may_have_changed)
