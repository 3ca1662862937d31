"""Runs: starting them (async ones on the loop, sync ones on the worker threads through
:class:`~.sync_runs.SyncRuns`), their timeouts, cutting them off, and how they ended.

The engine's hot path. A burst of runs is started on the loop, handed to the workers
together, and finished in batches.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from replicron.backends.base import Claim, RunRecord
from replicron.clock import Clock
from replicron.context import CancelReason, _current
from replicron.events import Outcome

from .lifecycle import Lifecycle
from .observe import Observer
from .recorder import Recorder
from .registry import JobRegistry, JobState
from .run import Run, past_grace
from .sync_runs import SyncRuns

__all__ = ["Run", "RunExecutor"]

_WARNING, _ERROR = logging.WARNING, logging.ERROR


class RunExecutor:
    """Owns the runs under way, their timeouts and their ends; its :class:`SyncRuns` owns the
    worker threads."""

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
        lease_end: Callable[[int], float | None] | None = None,
    ) -> None:
        self.clock, self.replica_id = clock, replica_id
        #: Where the backend's locks run under a lease: when a run's lease ends.
        self._lease_end = lease_end
        self._registry, self._recorder, self._observer, self._life = (
            registry,
            recorder,
            observer,
            life,
        )
        self._on_idle = on_idle
        #: The sync runs' side: worker threads, hand-over, hand-back, the collector hold.
        self.sync = SyncRuns(
            clock=clock,
            life=life,
            max_workers=max_workers,
            defer_gc=defer_gc,
            finish=self._finish,
        )
        self.active: set[Run] = set()
        #: Run ids whose locks the backend lost since the dispatch under way claimed them.
        self.lost_unstarted: set[int] = set()
        self._prepared: dict[str, Run] = {}  # job -> its run at the next instant, made ahead
        self._deadlines: list[tuple[datetime, int, Run]] = []
        self._seq = itertools.count()
        self._started_async = False  # an async run was started since the collector was held
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._hurried = False
        self._stop_by: float | None = None  # when a shutdown cuts the runs off

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()
        self.sync.open(loop, f"replicron-worker-{self.replica_id}")

    def __bool__(self) -> bool:
        """Whether runs are under way or finished and not yet accounted for."""
        return bool(self.active or self.sync)

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
        grace = None if manual else spec.misfire_grace
        if grace is not None and started - claim.scheduled_at > grace:
            why = past_grace(started - claim.scheduled_at, grace)
            self._recorder.record(state, claim, Outcome.MISSED, why, claim.locked, then_next=True)
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
            claim.run_id,
            claim.locked,
            started,
            deadline,
            manual,
            spec.call,
        )
        if claim.locked and claim.run_id is not None and self._lease_end is not None:
            run._lease_end = functools.partial(self._lease_end, claim.run_id)
        # A sync run may wait for a worker thread: the grace bounds its real start too.
        run.start_by = None if grace is None or spec.is_async else scheduled_at + grace
        state.running += 1
        if not manual:
            state.runs_started += 1
            # A run that may yet be missed on its thread retires its job once it has run.
            if max_runs is not None and run.start_by:
                state.may_miss += 1
            elif max_runs is not None and state.runs_started >= max_runs:
                self._registry.retire(spec.name, state)
        active = self.active
        if not active:
            assert self._idle is not None
            self._idle.clear()
        active.add(run)
        if self._stop_by is not None:  # started as the scheduler stops
            run._stopping(self._stop_by)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._seq), run))
        if self._observer.listeners:
            self._observer.notify("before_run", run.event(None, None))
        if spec.is_async:
            assert self._loop is not None
            run.task = self._loop.create_task(self._run_async(run))
            run.task.add_done_callback(functools.partial(self._cut_off_before_it_began, run))
            self._started_async = True
            return
        self.sync.submit(run)

    def hold_collector(self) -> None:
        """Hold the collector back while an instant's runs start (if asked to: see
        ``collector``)."""
        if self.sync.hold_collector():
            self._started_async = False

    def release_collector_once_started(self) -> None:
        self.sync.release_collector_once_started(self._started_async)

    # ---- running -----------------------------------------------------------------------

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
        run.returned()
        self._finish(run, error, self.clock.now())

    def _cut_off_before_it_began(self, run: Run, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never enters its coroutine, which is what
        records the run (a replica frozen between a claim and its run's start, told at its
        thaw that the lock is lost): recorded here, as a run that never started, rather
        than heartbeated for as long as the replica lives."""
        if task.cancelled() and not run.finished:
            run.unstarted = True
            self._finish(run, None, self.clock.now())

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
                _WARNING,
                "timed_out",
                f"run passed its timeout of {timeout}; "
                + ("cancelled" if run.task else "signalled (cancel event set)"),
                run.job_name,
                run.scheduled_at,
                run.run_id,
            )
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
                _ERROR,
                "lock_lost",
                "lost the run's lock; the run was told to stop",
                run.job_name,
                run.scheduled_at,
                run.run_id,
            )
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

    def stopping(self, by: float) -> None:
        """The scheduler shuts down: the runs going on, and any started from now on, are cut
        off at ``by`` (``time.monotonic()``) if they have not ended (see ``stop_deadline``)."""
        if self._stop_by is None or by < self._stop_by:
            self._stop_by = by
        for run in self.active:
            run._stopping(self._stop_by)

    def stop_waiting(self) -> None:
        """A shutdown waiting for runs to finish waits no more (they are cut off at once)."""
        self._hurried = True
        self.stopping(time.monotonic())
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
                    _WARNING,
                    "run_ignores_cancellation",
                    f"async run still going {grace} s after it was cancelled; left to it",
                    run.job_name,
                    run.scheduled_at,
                    run.run_id,
                )
        for run in list(self.active):  # sync runs still in their threads
            self._finish(run, None, self.clock.now())

    async def stop_workers(self, grace: float) -> None:
        """Let the worker threads go; a thread still in a run ``grace`` seconds after its run
        was told to stop (a task that does not look at ``cancelled``) is named and left (it
        is a daemon thread)."""
        for name in await self.sync.stop(grace):
            self._observer.log(
                _WARNING,
                "worker_stuck",
                f"{name} is still in a run {grace} s after it was told to stop; left to it",
            )

    # ---- finishing ---------------------------------------------------------------------

    def _finish(self, run: Run, error: BaseException | None, finished: datetime) -> None:
        if run.finished:
            return
        run.finished = True
        from_unix = self.sync.from_unix
        if run.unix_started is not None and from_unix is not None:
            run.started_at = from_unix(run.unix_started)
        state = run.state
        state.running -= 1
        missed_written = None
        if run.start_by is not None and not run.manual:
            max_runs = state.spec.max_runs
            if max_runs is not None and run.missed is not None:
                # The backend counts it as a run until its outcome is written.
                missed_written = functools.partial(_written, state)
            elif max_runs is not None:
                state.may_miss -= 1
            if run.missed is not None:
                state.runs_started -= 1  # it did not run: it does not count against max_runs
            elif max_runs is not None and state.runs_started >= max_runs:
                self._registry.retire(state.spec.name, state)
        self.active.discard(run)
        if run.task is None:  # a sync run (even if its job has since become async)
            self.sync.finished(run)
        outcome, text = run.outcome(error, finished)
        ran = run.missed is None and not run.unstarted
        record = RunRecord(
            run.job_name,
            run.scheduled_at,
            outcome,
            self.replica_id,
            run.run_id,
            # A run that never started ends when it is recorded: a fixed-delay job goes on
            # from then.
            run.started_at if ran else None,
            finished,
            text,
            run.manual,
        )
        recorder = self._recorder
        recorder.report(
            record,
            state,
            error=error,
            detail=run.cancel_detail if ran else text,
            announced=run.timed_out,
        )
        recorder.release(record, run.locked, state, missed_written)
        if not self.active:
            assert self._idle is not None
            self._idle.set()
            self._on_idle()


def _written(state: JobState) -> None:
    """The outcome of a run of ``state``'s job missed on its thread is written."""
    state.may_miss -= 1
