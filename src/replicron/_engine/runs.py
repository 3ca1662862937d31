"""Runs: starting them (async ones on the loop, sync ones on the worker threads), their
timeouts, and how they ended.

The engine's hot path. A burst of runs is started on the loop, handed to the workers
together, and finished in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from replicron.backends.base import Claim, RunRecord
from replicron.clock import Clock, _RealTimeWaits
from replicron.context import CancelReason, RunContext, _current
from replicron.events import Outcome, RunEvent

from .collector import HOLD_LIMIT, CollectorHold
from .lifecycle import Lifecycle
from .observe import Observer
from .recorder import Recorder
from .registry import JobRegistry, JobState
from .workers import STUCK_AFTER, WorkerPool

__all__ = ["Run", "RunExecutor"]

_WARNING, _ERROR = logging.WARNING, logging.ERROR
#: Runs handed to the workers at once within a burst.
_SUBMIT_CHUNK = 256


class Run(RunContext):
    """A run under way: the context its task sees (``current_run()``) and, in the same
    object (one allocation per run), the engine's bookkeeping of it."""

    __slots__ = (
        "call", "error", "finished", "finished_at", "locked", "started_at", "state", "task",
        "timed_out", "unix_finished", "unix_started",
    )  # fmt: skip

    def __init__(self, state: JobState, job: str, scheduled_at: datetime, replica_id: str) -> None:
        # RunContext's fields set here rather than through its __init__: once per run. The
        # run id, lock, start and deadline are set when the run starts (see ``start``).
        self.job_name = job
        self.scheduled_at = scheduled_at
        self.manual = False
        self.run_id: int | None = None
        self.replica_id = replica_id
        self.deadline: datetime | None = None
        self.cancel_reason: CancelReason | None = None
        self.cancel_detail: str | None = None  # what cut the run off, for the ledger too
        self._event = None
        self._stop = False
        self.state = state
        self.locked = False
        self.started_at = scheduled_at
        self.timed_out = self.finished = False  # timed_out: on_timeout was told at the deadline
        self.task: asyncio.Task[None] | None = None
        # The task as it was when the run started: a job updated meanwhile runs the new one
        # from its next run on.
        self.call: Callable[[], Any] = state.spec.call
        # A sync run's result, handed back to the loop with the run.
        self.error: BaseException | None = None
        self.finished_at: datetime | None = None
        # Where the clock tells Unix time: the sync run's real start and end, on its thread.
        self.unix_started: float | None = None
        self.unix_finished = 0.0

    def event(self, outcome: Outcome | None, error: BaseException | None) -> RunEvent:
        return RunEvent(
            self.job_name, self.scheduled_at, self.replica_id, self.run_id, outcome,
            self.started_at, None, error, None, self.manual,
        )  # fmt: skip

    @property
    def abandoned(self) -> bool:
        reason = self.cancel_reason
        return reason is not None and reason is not CancelReason.TIMEOUT

    def cut_off(self, reason: CancelReason, detail: str) -> None:
        """Tell the run to stop: its task is cancelled, a sync task sees ``cancelled`` set."""
        if reason is CancelReason.TIMEOUT:
            self.timed_out = True
        self.cancel(reason, detail)
        if self.task is not None:
            self.task.cancel()


class RunExecutor:
    """Owns the runs under way, the worker threads, the timeouts and the collector hold."""

    def __init__(
        self,
        *,
        clock: Clock,
        replica_id: str,
        registry: JobRegistry,
        recorder: Recorder,
        observer: Observer,
        life: Lifecycle,
        max_workers: int,
        defer_gc: bool,
        on_idle: Callable[[], None],
    ) -> None:
        self.clock, self.replica_id = clock, replica_id
        self._registry, self._recorder, self._observer, self._life = (
            registry, recorder, observer, life,
        )  # fmt: skip
        self._max_workers, self._on_idle = max_workers, on_idle
        self._from_unix: Callable[[float], datetime] | None = None
        if isinstance(clock, _RealTimeWaits) and clock.tells_unix_time():
            self._from_unix = clock.from_unix
        self.active: set[Run] = set()
        #: Sync runs started and not yet finished: on a worker thread, or waiting for one.
        self.sync_active = 0
        #: Run ids whose locks the backend lost since the dispatch under way claimed them.
        self.lost_unstarted: set[int] = set()
        #: Called on the loop when a sync run finishes (a worker thread is free again).
        self.on_thread_free: Callable[[], None] | None = None
        self._prepared: dict[str, Run] = {}  # job -> its run at the next instant, made ahead
        self._deadlines: list[tuple[datetime, int, Run]] = []
        self._seq = itertools.count()
        self._done: deque[Run] = deque()
        self._done_wake_pending = False
        self._to_submit: list[Run] = []
        self._supervising = False
        self._collector = CollectorHold(defer_gc)
        self._collector_limit: asyncio.TimerHandle | None = None
        self._started_async = False  # an async run was started since the collector was held
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: WorkerPool[Run] | None = None
        self._idle: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._hurried = False

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers = WorkerPool(
            self._max_workers, f"replicron-worker-{self.replica_id}", self._run_sync
        )

    def __bool__(self) -> bool:
        """Whether runs are under way or finished and not yet accounted for."""
        return bool(self.active or self._done)

    @property
    def backlogged(self) -> bool:
        """Whether the last burst is still being worked off (runs wait for a thread, or
        finished runs for the loop)."""
        return bool((self._workers is not None and self._workers.waiting) or self._done)

    @property
    def workers(self) -> int:
        return self._max_workers

    @property
    def threads_taken(self) -> int:
        """Sync runs on a worker thread or waiting for one: those started, less those that
        finished and wait for the loop's bookkeeping (put off while runs wait for a thread,
        which must not keep the next claim waiting too)."""
        return self.sync_active - len(self._done)

    @property
    def run_seconds(self) -> float | None:
        """How long a sync run holds its worker thread, on average (None until one ran)."""
        return None if self._workers is None else self._workers.run_seconds

    def next_deadline(self) -> datetime | None:
        return self._deadlines[0][0] if self._deadlines else None

    # ---- starting ----------------------------------------------------------------------

    def prepare(self, state: JobState, tick: datetime) -> None:
        """Make the run of ``state``'s job at ``tick`` ahead of time (see
        ``Dispatcher.prepare``); ``start`` takes it if the tick is claimed."""
        job = state.spec.name
        self._prepared[job] = Run(state, job, tick, self.replica_id)

    def forget_prepared(self) -> None:
        self._prepared.clear()

    def start(self, state: JobState, claim: Claim, now: datetime | None = None) -> None:
        # Once per run of a burst, before the burst's last run can begin: kept lean.
        spec = state.spec
        # A manual run (run_now) is not a tick: neither max_runs nor misfire_grace apply.
        manual = claim.manual
        max_runs = None if manual else spec.max_runs
        if max_runs is not None and state.runs_started >= max_runs:
            self._recorder.record(state, claim, Outcome.MISSED, "max_runs reached", claim.locked)
            return
        # One clock read per batch; the run's real start is taken again where it begins.
        started = self.clock.now() if now is None else now
        grace = spec.misfire_grace
        if grace is not None and not manual and started - claim.scheduled_at > grace:
            late = started - claim.scheduled_at
            why = f"it would have started {late} after its tick, past misfire_grace {grace}"
            self._recorder.record(state, claim, Outcome.MISSED, why, claim.locked)
            return
        timeout = spec.timeout
        deadline = None if timeout is None else started + timeout
        job, scheduled_at = claim.job, claim.scheduled_at
        run = self._prepared.get(job)
        if run is not None and run.scheduled_at is scheduled_at and run.state is state:
            del self._prepared[job]
        else:
            run = Run(state, job, scheduled_at, self.replica_id)
        run.run_id, run.locked, run.started_at, run.deadline, run.manual, run.call = (
            claim.run_id, claim.locked, started, deadline, manual, spec.call,
        )  # fmt: skip
        state.running += 1
        if not manual:
            state.runs_started += 1
            if max_runs is not None and state.runs_started >= max_runs:
                self._registry.retire(spec.name)
        active = self.active
        if not active:
            assert self._idle is not None
            self._idle.clear()
        active.add(run)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._seq), run))
        if self._observer.listeners:
            self._observer.notify("before_run", run.event(None, None))
        if spec.is_async:
            assert self._loop is not None
            run.task = self._loop.create_task(self._run_async(run))
            self._started_async = True
            return
        self.sync_active += 1
        # Runs of one instant go to the workers together, once the loop is done with them.
        to_submit = self._to_submit
        if not to_submit:
            assert self._loop is not None
            self._loop.call_soon(self.submit_all)
        to_submit.append(run)
        if len(to_submit) >= _SUBMIT_CHUNK:  # long bursts: let the first runs begin
            self.submit_all()

    def submit_all(self) -> None:
        """Hand the sync runs started so far to the workers."""
        runs, self._to_submit = self._to_submit, []
        if runs:
            assert self._workers is not None
            self._workers.submit_many(runs)
            if not self._supervising:
                self._supervising = True
                self._supervise_workers()

    def _supervise_workers(self) -> None:
        """While runs wait for a thread, wake more threads if the awake ones are stuck."""
        assert self._workers is not None
        assert self._loop is not None
        if self._workers.supervise() and self._life.phase != "stopped":
            self._loop.call_later(STUCK_AFTER, self._supervise_workers)
        else:
            self._supervising = False
            self.release_collector()  # every run of the burst has a thread

    # ---- the collector may be held back while an instant's runs start (see collector) --

    def hold_collector(self) -> None:
        if self._collector.take():
            self._started_async = False
            assert self._loop is not None
            self._collector_limit = self._loop.call_later(HOLD_LIMIT, self.release_collector)

    def release_collector_once_started(self) -> None:
        """After a dispatch: sync runs still waiting for a thread keep the collector held
        until they all have one (the supervisor lets it go then). Async runs take their first
        step on this loop next, and must not take it held: blocking the loop, it would keep
        the hold's time limit from firing."""
        if self._collector.held and (self._started_async or not self._supervising):
            self.release_collector()

    def release_collector(self) -> None:
        if self._collector_limit is not None:
            self._collector_limit.cancel()
            self._collector_limit = None
        self._collector.release()

    # ---- running -----------------------------------------------------------------------

    def _run_sync(self, run: Run) -> None:
        if run.finished:  # abandoned at shutdown before a worker got to it
            return
        unix_time = self._from_unix is not None
        if unix_time:
            run.unix_started = time.time()
        else:
            run.started_at = self.clock.now()
        token = _current.set(run)
        error: BaseException | None = None
        try:
            run.call()
        except BaseException as exc:  # a task must never take its worker thread down
            error = exc
        finally:
            _current.reset(token)
        if unix_time:
            run.unix_finished = time.time()
        else:
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
        if workers is not None and workers.waiting and self._life.running:
            # Runs still wait for a thread: starting them matters more than bookkeeping, so
            # leave the GIL to the workers and look again shortly (the flag stays set, so
            # finishing workers do not wake the loop meanwhile).
            assert self._loop is not None
            self._loop.call_later(STUCK_AFTER, self._drain_done)
            if self.on_thread_free is not None:  # threads freed up: claim more meanwhile
                self.on_thread_free()
            return
        self._done_wake_pending = False
        done, finish = self._done, self._finish
        from_unix = self._from_unix
        while done:
            run = done.popleft()
            finished = run.finished_at if from_unix is None else from_unix(run.unix_finished)
            assert finished is not None
            finish(run, run.error, finished)
            run.error = None  # a run with a timeout stays referenced until its deadline

    async def _run_async(self, run: Run) -> None:
        run.started_at = self.clock.now()
        _current.set(run)
        error: BaseException | None = None
        try:
            await run.call()
        except asyncio.CancelledError as exc:
            if run.cancel_reason is None:
                error = exc
        except Exception as exc:
            error = exc
        self._finish(run, error, self.clock.now())

    # ---- cutting runs off --------------------------------------------------------------

    def expire(self, now: datetime) -> None:
        """Cut off the runs past their timeout."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, run = heapq.heappop(deadlines)
            if run.finished:
                continue
            timeout = run.state.spec.timeout
            run.cut_off(CancelReason.TIMEOUT, f"passed its timeout of {timeout}")
            self._observer.log(
                _WARNING, "timed_out",
                f"run passed its timeout of {timeout}; "
                + ("cancelled" if run.task else "signalled (cancel event set)"),
                run.job_name, run.scheduled_at, run.run_id,
            )  # fmt: skip
            if self._observer.listeners:
                self._observer.notify("on_timeout", run.event(Outcome.TIMED_OUT, None))

    def lock_lost(self, run_ids: Sequence[int]) -> None:
        """The backend lost these runs' locks: they are no longer protected against overlap,
        so they are told to stop and will be recorded abandoned."""
        lost = set(run_ids)
        # Runs claimed ahead of their instant and not yet started: the dispatcher records
        # them abandoned instead of starting them.
        self.lost_unstarted |= lost
        for run in list(self.active):
            if run.run_id not in lost or run.finished:
                continue
            run.cut_off(CancelReason.LOCK_LOST, "lost its lock with the backend session")
            error = ConnectionError("the run's lock was lost with the backend session")
            self._observer.log(
                _ERROR, "lock_lost", "lost the run's lock; the run was told to stop",
                run.job_name, run.scheduled_at, run.run_id,
            )  # fmt: skip
            if self._observer.listeners:
                self._observer.notify("on_lock_error", run.event(None, error))

    async def wait_finished(self, timeout: float) -> None:
        """Wait for the runs going on to finish, up to ``timeout`` seconds or until
        :meth:`stop_waiting`."""
        assert self._idle is not None
        if self.active and not self._hurried:
            self._hurry = asyncio.Event()
            waits = {asyncio.ensure_future(e.wait()) for e in (self._idle, self._hurry)}
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    def stop_waiting(self) -> None:
        """A shutdown waiting for runs to finish waits no more (they are cut off at once)."""
        self._hurried = True
        if self._hurry is not None:
            self._hurry.set()

    async def abandon_all(self, grace: float) -> None:
        """At shutdown: cut off every run still going; recorded abandoned. Async runs get
        ``grace`` seconds to end once cancelled; one that goes on is named and left."""
        tasks = {}
        for run in list(self.active):
            run.cut_off(CancelReason.SHUTDOWN, "the scheduler shut down before the run returned")
            if run.task is not None:
                tasks[run.task] = run
        if tasks:
            _, going_on = await asyncio.wait(tasks, timeout=grace)
            for task in going_on:
                run = tasks[task]
                self._observer.log(
                    _WARNING, "run_ignores_cancellation",
                    f"async run still going {grace} s after it was cancelled; left to it",
                    run.job_name, run.scheduled_at, run.run_id,
                )  # fmt: skip
        for run in list(self.active):  # sync runs still in their threads
            self._finish(run, None, self.clock.now())

    async def stop_workers(self, grace: float) -> None:
        """Let the worker threads go; a thread still in a run ``grace`` seconds after its run
        was told to stop (a task that does not look at ``cancelled``) is named and left (it
        is a daemon thread)."""
        assert self._workers is not None
        stuck = await asyncio.to_thread(self._workers.stop, grace)
        for thread in stuck:
            self._observer.log(
                _WARNING, "worker_stuck",
                f"{thread.name} is still in a run {grace} s after it was told to stop; left to it",
            )  # fmt: skip

    # ---- finishing ---------------------------------------------------------------------

    def _finish(self, run: Run, error: BaseException | None, finished: datetime) -> None:
        if run.finished:
            return
        run.finished = True
        if run.unix_started is not None and self._from_unix is not None:
            run.started_at = self._from_unix(run.unix_started)
        state = run.state
        state.running -= 1
        self.active.discard(run)
        if run.task is None:  # a sync run (even if its job has since become async)
            self.sync_active -= 1
            if self.on_thread_free is not None:
                self.on_thread_free()
        if run.abandoned:
            outcome = Outcome.ABANDONED
        elif run.timed_out:
            outcome = Outcome.TIMED_OUT
            deadline = run.deadline
            overrun = timedelta(0) if deadline is None else finished - deadline
            if run.task is None and overrun > timedelta(0):
                run.cancel_detail = (
                    f"{run.cancel_detail}; the sync task returned {overrun} after it"
                )
        else:
            outcome = Outcome.FAILED if error is not None else Outcome.SUCCEEDED
        text = run.cancel_detail if error is None else f"{type(error).__name__}: {error}"
        record = RunRecord(
            run.job_name, run.scheduled_at, outcome, self.replica_id, run.run_id,
            run.started_at, finished, text, run.manual,
        )  # fmt: skip
        recorder = self._recorder
        recorder.report(
            record, state, error=error, detail=run.cancel_detail, announced=run.timed_out
        )
        recorder.release(record, run.locked, state)
        if not self.active:
            assert self._idle is not None
            self._idle.set()
            self._on_idle()
