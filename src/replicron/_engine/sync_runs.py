"""Sync runs on the worker threads: the runs of an instant handed over together, more threads
woken only when the awake ones are stuck, finished runs handed back to the loop in batches,
and the collector optionally held back until every run of a burst has a thread.

The engine's hot path: a burst of thousands of runs goes through here within milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime

from replicron.clock import Clock, _RealTimeWaits
from replicron.context import _current

from .collector import HOLD_LIMIT, CollectorHold
from .lifecycle import Lifecycle
from .run import Run, past_grace
from .workers import STUCK_AFTER, WorkerPool

__all__ = ["SyncRuns"]

#: Runs handed to the workers at once within a burst.
_SUBMIT_CHUNK = 256

Finish = Callable[[Run, BaseException | None, datetime], None]


class SyncRuns:
    """Owns the worker threads, the runs waiting to be handed to them, the finished runs
    waiting for the loop, and the collector hold."""

    def __init__(
        self,
        *,
        clock: Clock,
        life: Lifecycle,
        max_workers: int,
        defer_gc: bool,
        finish: Finish,
    ) -> None:
        self.clock, self._life, self._finish = clock, life, finish
        self.workers = max_workers
        #: Where the clock tells Unix time, a run reads ``time.time()`` on its thread (cheap)
        #: and the loop turns it into the clock's time, in the batch.
        self.from_unix: Callable[[float], datetime] | None = None
        if isinstance(clock, _RealTimeWaits) and clock.tells_unix_time():
            self.from_unix = clock.from_unix
        #: Sync runs started and not yet finished: on a worker thread, or waiting for one.
        self.active = 0
        #: Called on the loop when a sync run finishes (a worker thread is free again).
        self.on_thread_free: Callable[[], None] | None = None
        self._done: deque[Run] = deque()
        self._done_wake_pending = False
        self._to_submit: list[Run] = []
        self._supervising = False
        self._collector = CollectorHold(defer_gc)
        self._collector_limit: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: WorkerPool[Run] | None = None

    def open(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._pool = WorkerPool(self.workers, name, self._run)

    def __bool__(self) -> bool:
        """Whether finished runs wait for the loop's bookkeeping."""
        return bool(self._done)

    @property
    def backlogged(self) -> bool:
        """Whether the last burst is still being worked off (runs wait for a thread, or
        finished runs for the loop)."""
        return bool((self._pool is not None and self._pool.waiting) or self._done)

    @property
    def threads_taken(self) -> int:
        """Runs on a worker thread or waiting for one: those started, less those that
        finished and wait for the loop's bookkeeping (put off while runs wait for a thread,
        which must not keep the next claim waiting too)."""
        return self.active - len(self._done)

    @property
    def run_seconds(self) -> float | None:
        """How long a run holds its worker thread, on average (None until one ran)."""
        return None if self._pool is None else self._pool.run_seconds

    # ---- handing runs over ---------------------------------------------------------------

    def submit(self, run: Run) -> None:
        """Run ``run`` on a worker thread: with the other runs of its instant, once the loop
        is done with them."""
        self.active += 1
        to_submit = self._to_submit
        if not to_submit:
            assert self._loop is not None
            self._loop.call_soon(self.submit_all)
        to_submit.append(run)
        if len(to_submit) >= _SUBMIT_CHUNK:  # long bursts: let the first runs begin
            self.submit_all()

    def submit_all(self) -> None:
        """Hand the runs submitted so far to the workers."""
        runs, self._to_submit = self._to_submit, []
        if runs:
            assert self._pool is not None
            self._pool.submit_many(runs)
            if not self._supervising:
                self._supervising = True
                self._supervise()

    def _supervise(self) -> None:
        """While runs wait for a thread, wake more threads if the awake ones are stuck."""
        assert self._pool is not None
        assert self._loop is not None
        if self._pool.supervise() and self._life.phase != "stopped":
            self._loop.call_later(STUCK_AFTER, self._supervise)
        else:
            self._supervising = False
            self.release_collector()  # every run of the burst has a thread

    def finished(self, run: Run) -> None:
        """``run`` is accounted for: its thread is free (or it never had one)."""
        self.active -= 1
        if self.on_thread_free is not None:
            self.on_thread_free()

    # ---- the collector may be held back while an instant's runs start (see collector) --

    def hold_collector(self) -> bool:
        """Hold the collector back (if asked to); whether a new hold was taken."""
        if not self._collector.take():
            return False
        assert self._loop is not None
        self._collector_limit = self._loop.call_later(HOLD_LIMIT, self.release_collector)
        return True

    def release_collector_once_started(self, started_async: bool) -> None:
        """After a dispatch: runs still waiting for a thread keep the collector held until
        they all have one (the supervisor lets it go then). Async runs (``started_async``)
        take their first step on this loop next, and must not take it held: blocking the
        loop, it would keep the hold's time limit from firing."""
        if self._collector.held and (started_async or not self._supervising):
            self.release_collector()

    def release_collector(self) -> None:
        if self._collector_limit is not None:
            self._collector_limit.cancel()
            self._collector_limit = None
        self._collector.release()

    # ---- on a worker thread, and back ----------------------------------------------------

    def _run(self, run: Run) -> None:
        if run.finished:  # abandoned at shutdown before a worker got to it
            return
        unix_time = self.from_unix is not None
        if unix_time:
            run.unix_started = time.time()
        else:
            run.started_at = self.clock.now()
        if run.cancel_reason is not None:  # cut off (timed out, lock lost) while it waited
            run.unstarted = True
            self._ended_unrun(run)
            self._hand_back(run)
            return
        if run.start_by is not None and self._too_late(run):
            self._hand_back(run)
            return
        token = _current.set(run)
        error: BaseException | None = None
        try:
            run.call()
        except BaseException as exc:  # a task must never take its worker thread down
            error = exc
        finally:
            _current.reset(token)
        run.returned()
        if unix_time:
            run.unix_finished = time.time()
        else:
            run.finished_at = self.clock.now()
        run.error = error
        self._hand_back(run)

    def _too_late(self, run: Run) -> bool:
        """Whether ``run`` got its thread past its job's ``misfire_grace``: then it is not
        run, and is recorded missed, whatever kept it waiting."""
        start_by = run.start_by
        assert start_by is not None
        started = self._ended_unrun(run)
        if started <= start_by:
            return False
        run.missed = past_grace(started - run.scheduled_at, start_by - run.scheduled_at)
        return True

    def _ended_unrun(self, run: Run) -> datetime:
        """End ``run`` where it would have started (its task is not called): when is that."""
        if self.from_unix is None:
            started = run.finished_at = run.started_at
            return started
        unix_started = run.unix_finished = run.unix_started or 0.0
        return self.from_unix(unix_started)

    def _hand_back(self, run: Run) -> None:
        # Hand the result back in batches: one loop wake-up for all runs finished meanwhile.
        # No lock: deque appends are atomic, and _drain clears the flag before it empties
        # the deque, so a result appended meanwhile either is drained or wakes it.
        self._done.append(run)
        if self._done_wake_pending:
            return
        self._done_wake_pending = True
        loop = self._loop
        assert loop is not None
        with contextlib.suppress(RuntimeError):  # loop gone: the run was abandoned at shutdown
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        pool = self._pool
        if pool is not None and pool.waiting and self._life.running:
            # Runs still wait for a thread: starting them matters more than bookkeeping, so
            # leave the GIL to the workers and look again shortly (the flag stays set, so
            # finishing workers do not wake the loop meanwhile).
            assert self._loop is not None
            self._loop.call_later(STUCK_AFTER, self._drain)
            if self.on_thread_free is not None:  # threads freed up: claim more meanwhile
                self.on_thread_free()
            return
        self._done_wake_pending = False
        done, finish = self._done, self._finish
        from_unix = self.from_unix
        while done:
            run = done.popleft()
            finished = run.finished_at if from_unix is None else from_unix(run.unix_finished)
            assert finished is not None
            finish(run, run.error, finished)
            run.error = None  # a run with a timeout stays referenced until its deadline

    async def stop(self, grace: float) -> list[str]:
        """Let the worker threads go; returns the names of those still in a run ``grace``
        seconds after it was told to stop (daemon threads: they are left to it)."""
        assert self._pool is not None
        return [thread.name for thread in await asyncio.to_thread(self._pool.stop, grace)]
