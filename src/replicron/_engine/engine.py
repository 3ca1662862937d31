"""The engine: one asyncio implementation under both ``Scheduler`` and ``AsyncScheduler``.

It sleeps until the planner's next wake-up (or a job change), claims the due ticks from the
backend in one batch, starts the runs (async functions on the loop, sync functions on worker
threads), enforces timeouts and records every outcome. Job registration is synchronous and
thread-safe, so both faces share it unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import deque
from collections.abc import Awaitable, Sequence
from datetime import datetime, tzinfo
from typing import Any, Literal, TypeVar

from replicron.backends.base import Backend, Claim, ClaimRequest, ClaimStatus, RunRecord
from replicron.clock import Clock, ClusterClock, SystemClock
from replicron.context import _current
from replicron.errors import SchedulerClosedError
from replicron.events import Listener, Outcome

from .collector import CollectorHold
from .observe import Observer
from .planner import Tick, catch_up_plan, overlap_action, resync_plan, ticks_from
from .registry import JobState
from .retries import Retries
from .runs import Run, RunExecutor
from .workers import WorkerPool

__all__ = ["Engine"]

_INFO, _DEBUG, _WARNING, _ERROR = logging.INFO, logging.DEBUG, logging.WARNING, logging.ERROR
ConcurrencyMode = Literal["queue", "skip"]
#: What the engine does with a claimed tick: the overlap policy's answer, or the limit's.
TickAction = Literal["run", "skip", "queue", "limit_skip", "limit_queue"]
#: Named tuples built from a tuple of their fields without a Python-level call.
_new = tuple.__new__
_T = TypeVar("_T")
#: Seconds after a dispatch before the next instant is planned ahead (real time).
_PREPARE_DELAY = 0.02
#: Seconds before it that an instant further off is planned: in time to work out even 100,000
#: ticks, and late enough that jobs added in bulk meanwhile are not planned twice.
_PREPARE_AHEAD = 10.0


class Engine(RunExecutor):
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
        defer_gc: bool,
    ) -> None:
        if type(clock) is SystemClock:  # one time base for the cluster: the coordinator's
            clock = ClusterClock(clock, backend.clock_offset)
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
        self._workers: WorkerPool[Run] | None = None
        self._active: set[Run] = set()
        self._waiting: deque[tuple[JobState, Claim]] = deque()  # concurrency limit "queue"
        self._deadlines: list[tuple[datetime, int, Run]] = []
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._releases: list[tuple[RunRecord, bool, JobState | None]] = []
        self._done: deque[Run] = deque()
        self._done_wake_pending = False
        self._to_submit: list[Run] = []
        self._supervising = False
        self._prepare_handle: asyncio.TimerHandle | None = None
        self._prepare_for: datetime | None = None  # the instant _prepare_handle plans
        self._collector = CollectorHold(defer_gc)
        self._collector_limit: asyncio.TimerHandle | None = None
        self._started_async = False
        self._retries = Retries()
        self._stepping: list[Tick] = []  # due and missed ticks of the step under way
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
        limit = self.stop_timeout if timeout is None else timeout
        # The step under way ends soon, unless it waits on an unreachable backend: then it is
        # cut short, and what it was handling is recorded below like any unhandled tick.
        await asyncio.wait({self._main}, timeout=limit)
        if not self._main.done():
            self._main.cancel()
            self._retries.unhandle(self._stepping, self.clock.now())
            with contextlib.suppress(asyncio.CancelledError):
                await self._main  # it let the collector go as it ended
        if self._prepare_handle is not None:
            self._prepare_handle.cancel()
            self._prepare_handle = None
        for state, claim in self._waiting:
            self._record(state, claim, Outcome.MISSED, "scheduler shut down first", claim.locked)
        self._waiting.clear()
        for state in self._jobs.values():
            if state.pending is not None:
                self._record(state, state.pending, Outcome.MISSED, "scheduler shut down first")
                state.pending = None
        if wait and self._active and _current.get(None) is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), limit)
        await self._abandon_active()
        await self._flush_releases()
        if self._retries.unhandled:
            await self._record_unhandled_at_stop(limit)
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
        try:
            while self._state == "running":
                await self._sleep(await self._step())
        finally:
            self._release_collector()  # however the loop ends (cancelled with its loop, say)

    async def _step(self) -> datetime | None:
        """Handle what is due now; returns when to wake next. A step of its own so that
        nothing of an instant (its thousands of ticks, say) stays referenced while the loop
        sleeps: kept for a second, they would grow the collector's oldest generation."""
        assert self._wake is not None
        self._wake.clear()
        now = self.clock.now()
        with self._lock:
            decision = self._planner.decide(now)
            immediate, self._immediate = self._immediate, []
            catch_up, self._catch_up_needed = self._catch_up_needed, []
        immediate += self._retries.early_due(now)
        # Each step is guarded on its own: a backend failure must not stop the scheduler,
        # and failing to record a miss must not keep due ticks from running. What failed is
        # handled again once the backend answers: no tick is dropped with a failed statement.
        self._retries.new_step()
        if catch_up:
            found = await self._guarded(self._catch_up(catch_up, now), None, [])
            if found is None:
                with self._lock:
                    self._catch_up_needed.extend(catch_up)
                self._retries.retry_backend(now)
            else:
                immediate += found
        if self._retries.unhandled:
            immediate += await self._resync(now, {tick.job for tick in decision.due})
        due = immediate + decision.due
        self._stepping = due + decision.missed
        if due:
            if immediate:
                due = list(dict.fromkeys(due))  # a tick both resynced and due: claimed once
            self._hold_collector()
            try:
                if await self._guarded(self._dispatch(due), False, due) is False:
                    self._retries.unhandle(due, now)
            finally:
                self._release_collector_once_started()
        if decision.missed:
            missed = self._record_missed(decision.missed, decision.truncated)
            if await self._guarded(missed, False, decision.missed) is False:
                self._retries.unhandle(decision.missed, now)
        self._stepping = []
        self._expire(self.clock.now())
        with self._lock:
            wake_at = self._planner.wake_at()
        self._prepare_soon(wake_at)
        if self._deadlines and (wake_at is None or self._deadlines[0][0] < wake_at):
            wake_at = self._deadlines[0][0]
        return self._retries.wake_at(wake_at)

    async def _record_unhandled_at_stop(self, limit: float) -> None:
        """Ticks whose handling failed with the backend, at shutdown: recorded missed if the
        backend answers within ``limit`` seconds, else named in an ERROR record."""
        unhandled = self._retries.take_unhandled()
        ticks = [
            Tick(name, tick)
            for name, (first, last) in unhandled.items()
            if (state := self._jobs.get(name)) is not None
            for tick in ticks_from(state.spec.trigger, first, last)
        ]
        why = "the backend was unreachable when it fell due, and the scheduler shut down"
        try:
            await asyncio.wait_for(self._record_missed(ticks, set(), why), limit)
        except Exception as exc:
            listed = ", ".join(f"{job}@{tick.isoformat()}" for job, tick in ticks)
            self.observer.log(
                _ERROR, "lock_error", f"could not record {len(ticks)} unhandled ticks as "
                f"missed before shutting down ({exc!r}): {listed}",
            )  # fmt: skip

    async def _resync(self, now: datetime, due_now: set[str]) -> list[Tick]:
        """Ticks whose handling failed, now that the backend may answer: handled like ticks
        missed while no replica was up (see ``resync_plan``)."""
        unhandled = self._retries.take_unhandled()
        runs: list[Tick] = []
        missed: list[Tick] = []
        for name, (first, last) in unhandled.items():
            state = self._jobs.get(name)
            if state is None:
                continue
            spec = state.spec
            run, skip = resync_plan(
                spec.trigger, first, last, now, spec.catch_up, spec.misfire_grace,
                superseded=name in due_now,
            )  # fmt: skip
            if run:
                runs.append(Tick(name, run[0]))
                if len(run) > 1:
                    state.backlog = deque(run[1:])
            missed += [Tick(name, tick) for tick in skip]
        if missed:
            why = "the backend was unreachable when it fell due"
            if await self._guarded(self._record_missed(missed, set(), why), False, missed) is False:
                self._retries.unhandle(missed + runs, now)
                return []
        if runs or missed:
            self.observer.log(
                _WARNING, "resync",
                f"backend reachable again: {len(runs)} ticks to run, {len(missed)} recorded "
                "missed (by each job's catch_up and misfire_grace)",
            )  # fmt: skip
        return runs

    def _prepare_soon(self, wake_at: datetime | None) -> None:
        """Plan the next instant's ticks while idle: soon but not at once, since the runs just
        handed to the worker threads need the GIL first; or, for an instant further off than
        ``_PREPARE_AHEAD``, shortly before it (in real time: the clock's sleepers, which tests
        step through, see only the instants)."""
        if wake_at is None:
            return
        if self._prepare_handle is not None:
            if self._prepare_for is not None and self._prepare_for <= wake_at:
                return
            self._prepare_handle.cancel()  # an earlier instant comes first now
            self._prepare_handle = None
        lead = (wake_at - self.clock.now()).total_seconds()
        if lead > 4 * _PREPARE_DELAY:
            assert self._loop is not None
            delay = max(_PREPARE_DELAY, lead - _PREPARE_AHEAD)
            self._prepare_handle = self._loop.call_later(delay, self._prepare_now)
            self._prepare_for = wake_at

    def _prepare_now(self) -> None:
        self._prepare_handle = self._prepare_for = None
        if self._state != "running":
            return
        with self._lock:
            if (self._workers is not None and self._workers.waiting) or self._done:
                # The last burst is still being worked off: it goes first.
                self._prepare_soon(self._planner.wake_at())
                return
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
            elif ours is None:  # not yet due by the backend's clock (ours runs ahead): claim
                self._retries.early(Tick(record.job, record.scheduled_at), self.clock.now())
        for name in truncated:
            self.observer.log(_WARNING, "missed", "more ticks were missed than listed", name)

    # ---- dispatch ----------------------------------------------------------------------

    async def _dispatch(self, ticks: list[Tick]) -> bool:
        # These loops run once per tick of a burst, thousands of times at one instant, before
        # the last run of the burst can begin: keep them lean.
        requests: list[ClaimRequest] = []
        states: list[JobState] = []
        unusual: dict[int, TickAction] = {}  # position -> action, where it is not simply "run"
        limit, jobs_get = self.max_concurrent_jobs, self._jobs.get
        active = len(self._active) + len(self._waiting)
        add_request, add_state = requests.append, states.append
        for job, scheduled_at in ticks:
            state = jobs_get(job)
            if state is None:
                continue
            lock = state.spec.overlap != "allow"
            if state.running or limit is not None:
                action = self._action(state, active)
                if action == "run" or action == "limit_queue":
                    active += 1
                else:
                    lock = False
                if action != "run":
                    unusual[len(states)] = action
            add_request(_new(ClaimRequest, (job, scheduled_at, lock)))
            add_state(state)
        if not requests:
            return True
        claims = await self.backend.claim(requests)
        del requests  # thousands of objects, no longer needed while the runs start
        now = self.clock.now()
        if unusual:
            for index, (state, claim) in enumerate(zip(states, claims, strict=True)):
                self._settle(state, claim, unusual.get(index, "run"), now)
        else:
            start, claimed = self._start, ClaimStatus.CLAIMED
            for state, claim in zip(states, claims, strict=True):
                if claim.status is claimed:
                    start(state, claim, now)
                else:
                    self._settle(state, claim, "run", now)
        if self._to_submit:  # hand the instant's sync runs over before anything else
            self._submit_all()
        return True

    def _action(self, state: JobState, active: int) -> TickAction:
        """What to do with a tick of a job that is running here, or under a concurrency
        limit with ``active`` runs started or waiting."""
        action: TickAction = overlap_action(state.spec.overlap, state.running)
        limit = self.max_concurrent_jobs
        if action == "run" and limit is not None and active >= limit:
            return "limit_skip" if self.concurrency_mode == "skip" else "limit_queue"
        return action

    def _settle(self, state: JobState, claim: Claim, action: TickAction, now: datetime) -> None:
        """Start, record, queue or drop a tick the backend answered for."""
        status = claim.status
        if status is ClaimStatus.TAKEN:
            self.observer.log(
                _DEBUG, "taken", "another replica has it", claim.job, claim.scheduled_at
            )
        elif status is ClaimStatus.LOCKED:
            self._record(state, claim, Outcome.SKIPPED_OVERLAP, "running on another replica")
        elif status is ClaimStatus.EARLY:
            self.observer.log(
                _DEBUG, "early", "not yet due by the backend's clock; asking again shortly",
                claim.job, claim.scheduled_at,
            )  # fmt: skip
            self._retries.early(Tick(claim.job, claim.scheduled_at), now)
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
