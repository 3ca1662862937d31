"""The engine: one asyncio implementation under both ``Scheduler`` and ``AsyncScheduler``.

It sleeps until the planner's next wake-up (or a job change), claims the due ticks from the
backend in one batch, starts the runs (async functions on the loop, sync functions on worker
threads), enforces timeouts and records every outcome. Job registration is synchronous and
thread-safe, so both faces share it unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any, Literal, TypeVar

from ._observe import Observer
from ._registry import JobRegistry, JobState, event_of
from ._workers import STUCK_AFTER, WorkerPool
from .backends.base import Backend, Claim, ClaimRequest, ClaimStatus, Release, RunRecord
from .clock import Clock
from .context import RunContext, _current
from .errors import (
    SchedulerClosedError,
)
from .events import Listener, Outcome, RunEvent
from .planner import Tick, catch_up_plan, overlap_action

__all__ = ["Engine"]

_INFO, _DEBUG, _WARNING, _ERROR = logging.INFO, logging.DEBUG, logging.WARNING, logging.ERROR
ConcurrencyMode = Literal["queue", "skip"]
_T = TypeVar("_T")
#: Seconds after a dispatch before the next instant is planned ahead (real time).
_PREPARE_DELAY = 0.02
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
class _Run:
    job: JobState
    claim: Claim
    ctx: RunContext
    started_at: datetime
    timed_out: bool = False
    abandoned: bool = False
    finished: bool = False
    why: str | None = None  # what cut the run off, for the ledger
    task: asyncio.Task[None] | None = None


class Engine(JobRegistry):
    def __init__(
        self,
        *,
        clock: Clock,
        backend: Backend,
        timezone: tzinfo,
        replica_id: str,
        max_concurrent_jobs: int | None,
        concurrency_mode: ConcurrencyMode,
        stop_timeout: float,
        listeners: Sequence[Listener],
        max_workers: int,
    ) -> None:
        self.clock, self.backend, self.timezone = clock, backend, timezone
        self.replica_id = replica_id
        self.max_concurrent_jobs = max_concurrent_jobs
        self.concurrency_mode = concurrency_mode
        self.stop_timeout = stop_timeout
        self.max_workers = max_workers
        super().__init__()
        self._idle: asyncio.Event | None = None
        self._quiet_changed: asyncio.Event | None = None
        self._asleep = False
        self._asleep_until: datetime | None = None
        self._main: asyncio.Task[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._workers: WorkerPool[_Run] | None = None
        self._active: set[_Run] = set()
        self._waiting: deque[tuple[JobState, Claim]] = deque()  # concurrency limit "queue"
        self._deadlines: list[tuple[datetime, int, _Run]] = []
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._releases: list[tuple[RunRecord, bool, JobState | None]] = []
        self._done: deque[tuple[_Run, BaseException | None, datetime]] = deque()
        self._done_wake_pending = False
        self._to_submit: list[_Run] = []
        self._supervising = False
        self._prepare_handle: asyncio.TimerHandle | None = None
        self.observer = Observer(replica_id, listeners, self._spawn)

    # ---- life cycle (on the loop) ------------------------------------------------------

    async def start(self) -> None:
        self.check_usable()
        if self._state != "new":
            raise SchedulerClosedError("a scheduler can be started once")
        self._loop = asyncio.get_running_loop()
        self._pid = os.getpid()
        self._wake, self._idle = asyncio.Event(), asyncio.Event()
        self._quiet_changed = asyncio.Event()
        self._idle.set()
        self._stopped = self._loop.create_future()
        await self.backend.open(self.replica_id, self._lock_lost)
        self._workers = WorkerPool(
            self.max_workers, f"replicron-worker-{self.replica_id}", self._run_sync
        )
        with self._lock:
            self._state = "running"
            for state in self._jobs.values():
                self._plan(state)
            self._catch_up_needed.extend(self._jobs)
        self._main = self._loop.create_task(self._run_loop(), name="replicron-engine")
        self.observer.log(_INFO, "scheduler_started", f"scheduler started ({len(self._jobs)} jobs)")

    def close_unstarted(self) -> None:
        if self._state == "new":
            self._state = "stopped"

    @property
    def running(self) -> bool:
        return self._state == "running"

    async def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop claiming ticks, let runs finish for up to ``timeout`` seconds, then cancel
        and signal the rest; release every lock. Idempotent."""
        if self._state == "new":
            self.close_unstarted()
            return
        assert self._stopped is not None
        assert self._main is not None
        assert self._idle is not None
        if self._state != "running":
            await asyncio.shield(self._stopped)
            return
        self._state = "stopping"
        self._poke()
        await self._main
        for state, claim in self._waiting:
            self._record(state, claim, Outcome.MISSED, "scheduler shut down first", claim.locked)
        self._waiting.clear()
        for state in self._jobs.values():
            if state.pending is not None:
                self._record(state, state.pending, Outcome.MISSED, "scheduler shut down first")
                state.pending = None
        limit = self.stop_timeout if timeout is None else timeout
        if wait and self._active and _current.get(None) is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), limit)
        await self._abandon_active()
        await self._flush_releases()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=limit)
        await self.backend.close()
        assert self._workers is not None
        stuck = await asyncio.to_thread(self._workers.stop, 0.5 if wait else 0.0)
        for thread in stuck:
            self.observer.log(_ERROR, "worker_stuck", f"{thread.name} ignores cancellation")
        self._state = "stopped"
        self._stopped.set_result(None)
        self.observer.log(_INFO, "scheduler_stopped", "scheduler stopped")

    async def _abandon_active(self) -> None:
        tasks = []
        for run in list(self._active):
            run.abandoned = True
            run.why = "the scheduler shut down before the run returned"
            run.ctx.cancel()
            if run.task is not None:
                run.task.cancel()
                tasks.append(run.task)
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for run in list(self._active):  # sync runs still in their threads
            self._finish(run, None, self.clock.now())

    # ---- the loop ----------------------------------------------------------------------

    async def _run_loop(self) -> None:
        assert self._wake is not None
        while self._state == "running":
            self._wake.clear()
            now = self.clock.now()
            with self._lock:
                decision = self._planner.decide(now)
                immediate, self._immediate = self._immediate, []
                catch_up, self._catch_up_needed = self._catch_up_needed, []
            # Each step is guarded on its own: a backend failure must not stop the scheduler,
            # and failing to record a miss must not keep due ticks from running.
            if catch_up:
                immediate += await self._guarded(self._catch_up(catch_up, now), [], [])
            due = immediate + decision.due
            if due:
                await self._guarded(self._dispatch(due), None, due)
            if decision.missed:
                missed = self._record_missed(decision.missed, decision.truncated)
                await self._guarded(missed, None, decision.missed)
            self._expire(self.clock.now())
            with self._lock:
                wake_at = self._planner.wake_at()
            self._prepare_soon(wake_at)
            if self._deadlines and (wake_at is None or self._deadlines[0][0] < wake_at):
                wake_at = self._deadlines[0][0]
            await self._sleep(wake_at)

    def _prepare_soon(self, wake_at: datetime | None) -> None:
        """Plan the next instant's ticks while idle, but not at once: the runs just handed
        to the worker threads need the GIL first."""
        if wake_at is None or self._prepare_handle is not None:
            return
        lead = (wake_at - self.clock.now()).total_seconds()
        if lead > 4 * _PREPARE_DELAY:
            assert self._loop is not None
            self._prepare_handle = self._loop.call_later(_PREPARE_DELAY, self._prepare_now)

    def _prepare_now(self) -> None:
        self._prepare_handle = None
        if self._state != "running":
            return
        if (self._workers is not None and self._workers.waiting) or self._done:
            # The last burst is still being worked off: it goes first.
            wake_at = self._planner.wake_at()
            self._prepare_soon(wake_at)
            return
        with self._lock:
            self._planner.prepare()

    async def _guarded(self, step: Awaitable[_T], default: _T, ticks: list[Tick]) -> _T:
        try:
            return await step
        except Exception as exc:
            self.observer.log(_ERROR, "lock_error", f"backend failed: {exc!r}", exc_info=exc)
            self._notify_lock_error(ticks, exc)
            return default

    async def _sleep(self, until: datetime | None) -> None:
        assert self._wake is not None
        if self._wake.is_set() or (until is not None and until <= self.clock.now()):
            return
        self._asleep, self._asleep_until = True, until
        self._quiet_may_have_changed()
        try:
            if until is None:
                await self._wake.wait()
                return
            sleeper = asyncio.ensure_future(self.clock.asleep_until(until))
            waker = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
        finally:
            self._asleep = False

    async def wait_idle(self) -> None:
        """Return once nothing is left to do at the clock's current time: every due tick
        handled, no run active or waiting, every outcome recorded."""
        assert self._quiet_changed is not None
        while not self._is_quiet():
            self._quiet_changed.clear()
            await self._quiet_changed.wait()

    def _is_quiet(self) -> bool:
        if self._state != "running":
            return True
        assert self._wake is not None
        if not self._asleep or self._wake.is_set():
            return False
        if self._asleep_until is not None and self._asleep_until <= self.clock.now():
            return False
        return not (self._active or self._waiting or self._releases or self._tasks or self._done)

    def _quiet_may_have_changed(self, *_: object) -> None:
        if self._quiet_changed is not None:
            self._quiet_changed.set()

    async def _catch_up(self, names: list[str], now: datetime) -> list[Tick]:
        runs: list[Tick] = []
        lasts = await self.backend.last_ticks(names)
        for name in names:
            state, last = self._jobs.get(name), lasts.get(name)
            if state is None or last is None:
                continue
            spec = state.spec
            due, missed, truncated = catch_up_plan(
                spec.trigger, last, now, spec.catch_up, spec.misfire_grace
            )
            if due:
                # Catch-up runs go one after another, whatever the overlap policy.
                runs.append(Tick(name, due[0]))
                if len(due) > 1:
                    state.backlog = deque(due[1:])
            if missed:
                await self._record_missed(
                    [Tick(name, t) for t in missed],
                    {name} if truncated else set(),
                    "no replica ran it when it fell due (caught up on start)",
                )
        return runs

    async def _record_missed(
        self, ticks: list[Tick], truncated: set[str], why: str = "a later tick was due"
    ) -> None:
        missed, replica = Outcome.MISSED, self.replica_id
        records = [
            RunRecord(t.job, t.scheduled_at, missed, replica, None, None, None, why) for t in ticks
        ]
        recorded = await self.backend.record_unclaimed(records)
        for record, ours in zip(records, recorded, strict=True):
            if ours:
                self._report(record, self._jobs.get(record.job), detail=why)
        for name in truncated:
            self.observer.log(_WARNING, "missed", "more ticks were missed than listed", name)

    # ---- dispatch ----------------------------------------------------------------------

    async def _dispatch(self, ticks: list[Tick]) -> None:
        # This loop runs once per tick of a burst: keep it lean.
        requests: list[ClaimRequest] = []
        plans: list[tuple[JobState, str]] = []
        active = len(self._active) + len(self._waiting)
        limit, jobs = self.max_concurrent_jobs, self._jobs
        for job, scheduled_at in ticks:
            state = jobs.get(job)
            if state is None:
                continue
            overlap = state.spec.overlap
            action: str = "run" if not state.running else overlap_action(overlap, state.running)
            if action == "run" and limit is not None:
                if active >= limit:
                    action = "limit_skip" if self.concurrency_mode == "skip" else "limit_queue"
                active += 1
            lock = overlap != "allow" and action in ("run", "limit_queue")
            requests.append(ClaimRequest(job, scheduled_at, lock))
            plans.append((state, action))
        if not requests:
            return
        claims = await self.backend.claim(requests)
        now, claimed = self.clock.now(), ClaimStatus.CLAIMED
        for (state, action), claim in zip(plans, claims, strict=True):
            if action == "run" and claim.status is claimed:
                self._start(state, claim, now)
            elif claim.status is ClaimStatus.TAKEN:
                self.observer.log(
                    _DEBUG, "taken", "another replica has it", claim.job, claim.scheduled_at
                )
            elif claim.status is ClaimStatus.LOCKED:
                self._record(state, claim, Outcome.SKIPPED_OVERLAP, "running on another replica")
            elif action == "run":
                self._start(state, claim, now)
            elif action == "skip":
                self._record(state, claim, Outcome.SKIPPED_OVERLAP, "previous run still going")
            elif action == "limit_skip":
                self._record(state, claim, Outcome.SKIPPED_LIMIT, "max_concurrent_jobs reached")
            elif action == "limit_queue":
                self._waiting.append((state, claim))
            else:  # overlap "queue": keep one tick waiting; a newer one replaces it
                if state.pending is not None:
                    self._record(state, state.pending, Outcome.MISSED, "a later tick was queued")
                state.pending = claim
        if self._to_submit:  # hand the instant's sync runs over before anything else
            self._submit_all()

    def _start(self, state: JobState, claim: Claim, now: datetime | None = None) -> None:
        spec = state.spec
        if spec.max_runs is not None and state.runs_started >= spec.max_runs:
            self._record(state, claim, Outcome.MISSED, "max_runs reached", unlock=claim.locked)
            return
        # One clock read per batch; the run's real start is taken again where it begins.
        started = self.clock.now() if now is None else now
        deadline = None if spec.timeout is None else started + spec.timeout
        ctx = RunContext(spec.name, claim.scheduled_at, claim.run_id, self.replica_id, deadline)
        run = _Run(state, claim, ctx, started)
        state.running += 1
        state.runs_started += 1
        if spec.max_runs is not None and state.runs_started >= spec.max_runs:
            with self._lock:
                self._planner.remove(spec.name)
        if not self._active:
            assert self._idle is not None
            self._idle.clear()
        self._active.add(run)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._seq), run))
        if self.observer.listeners:
            self.observer.notify("before_run", self._event_of(run, None, None, None))
        if spec.is_async:
            assert self._loop is not None
            run.task = self._loop.create_task(self._run_async(run))
        else:
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

    def _run_sync(self, run: _Run) -> None:
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
        finished = self.clock.now()
        # Hand the result back in batches: one loop wake-up for all runs finished meanwhile.
        # No lock: deque appends are atomic, and _drain_done clears the flag before it
        # empties the deque, so a result appended meanwhile either is drained or wakes it.
        self._done.append((run, error, finished))
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
        done = self._done
        while done:
            self._finish(*done.popleft())

    async def _run_async(self, run: _Run) -> None:
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

    def _finish(self, run: _Run, error: BaseException | None, finished: datetime) -> None:
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
            state.last_record, state.last_error, state.last_detail = record, error, detail
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
            if finished.spec.overlap != "allow" and not await self.backend.lock(pending):
                self._record(finished, pending, Outcome.SKIPPED_OVERLAP, "running elsewhere")
            else:
                locked = Claim(pending.job, pending.scheduled_at, pending.status,
                               pending.run_id, finished.spec.overlap != "allow")  # fmt: skip
                self._start(finished, locked)
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
        self, run: _Run, outcome: Outcome | None, finished: datetime | None,
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
