"""The engine: one asyncio implementation under both ``Scheduler`` and ``AsyncScheduler``.

It sleeps until the planner's next wake-up (or a job change), reads the ledger for the
fixed-delay jobs whose next tick it does not know yet, claims the due ticks from the backend in
one batch, starts the runs, enforces timeouts and records every outcome. Its parts, each owning
its own state:

* :class:`~.registry.JobRegistry`: the jobs and their plan (registration from any thread);
* :class:`~.dispatch.Dispatcher`: claims a step's ticks and settles each answer;
* :class:`~.runs.RunExecutor`: the runs under way, the worker threads, timeouts;
* :class:`~.recorder.Recorder`: outcomes logged, told to listeners and written in batches;
* :class:`~.recovery.Recovery`: ticks missed while down or while the backend was unreachable;
* :class:`~.retries.Retries`: when to try the backend again;
* :class:`~.health.BackendHealth`: whether the backend answers, the one voice saying so.

The engine itself owns the life cycle and the loop that ties them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import TypeVar

from replicron.backends.base import Backend, LastFinishes, LeasedRuns, SharedCoordination
from replicron.clock import Clock, ClusterClock, SystemClock
from replicron.context import _current
from replicron.events import Listener

from .background import Background
from .cluster_watch import ClusterWatch
from .dispatch import ConcurrencyMode, Dispatcher
from .health import CATCHING_UP, CLAIMING, CLAIMING_MANUAL, RECORDING_MISSED, BackendHealth
from .leadership import Leadership
from .lifecycle import Lifecycle
from .membership import Membership, held_by_staying
from .observe import Observer
from .planner import Tick
from .recorder import Recorder
from .recovery import Recovery
from .registry import JobRegistry
from .retries import Retries
from .runs import RunExecutor
from .wakeup import Wakeup

__all__ = ["ConcurrencyMode", "Engine"]

_INFO, _WARNING = logging.INFO, logging.WARNING
_T = TypeVar("_T")


class _Failed:
    """What a guarded step returns when the backend failed it."""


_FAILED = _Failed()
#: Seconds a cancelled run has to end at shutdown, waiting (capped by the stop timeout) or not.
_CANCEL_GRACE, _CANCEL_GRACE_NO_WAIT = 5.0, 0.5
#: Where the backend cannot tell who stays: seconds a stopping replica leaves its deferred
#: ticks to the others before recording them missed (a few claims' round trips).
_HAND_OVER = 0.5
#: Seconds after a dispatch before the next instant is planned ahead (real time).
_PREPARE_DELAY = 0.02
#: Seconds before it that an instant further off is planned: in time to work out even 100,000
#: ticks, and late enough that jobs added in bulk meanwhile are not planned twice.
_PREPARE_AHEAD = 10.0
#: What a step first does with the backend, as told to the health.
_READING_FINISHES = "reading the last finish of fixed-delay jobs"


class Engine:
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
        logger: logging.Logger,
    ) -> None:
        if type(clock) is SystemClock:  # one time base for the cluster: the coordinator's
            clock = ClusterClock(clock, backend.clock_offset)
        self.clock, self.backend, self.replica_id = clock, backend, replica_id
        self.stop_timeout = stop_timeout
        self.life = Lifecycle()
        self._background = Background(self._quiet_may_have_changed)
        self.observer = Observer(logger, replica_id, listeners, self._background.spawn)
        self._shared = shared = backend if isinstance(backend, SharedCoordination) else None
        # A backend that refuses to coordinate said why itself: its refusals are no outage.
        refusal = (lambda: None) if shared is None else (lambda: shared.refusal)
        self.health = health = BackendHealth(self.observer, clock.now, refusal)
        self.registry = JobRegistry(
            clock=clock,
            timezone=timezone,
            backend=backend,
            life=self.life,
            wake=self._poke,
            changed=self._job_changed,
            replica_id=replica_id,
        )
        self._recorder = Recorder(
            backend=backend,
            registry=self.registry,
            observer=self.observer,
            background=self._background,
            life=self.life,
            replica_id=replica_id,
            health=health,
        )
        self._runs = RunExecutor(
            clock=clock,
            replica_id=replica_id,
            registry=self.registry,
            recorder=self._recorder,
            observer=self.observer,
            life=self.life,
            max_workers=max_workers,
            defer_gc=defer_gc,
            on_idle=self._quiet_may_have_changed,
            lease_end=backend.lease_end if isinstance(backend, LeasedRuns) else None,
        )
        self._retries = Retries()
        self.leadership = Leadership(backend, self.registry, self.observer, self._poke)
        self._dispatcher = Dispatcher(
            backend=backend,
            clock=clock,
            registry=self.registry,
            runs=self._runs,
            recorder=self._recorder,
            retries=self._retries,
            observer=self.observer,
            max_concurrent_jobs=max_concurrent_jobs,
            concurrency_mode=concurrency_mode,
            shared=shared,
            leadership=self.leadership,
            # Only on real time: a fake clock's instants are the ones a test sets.
            claim_ahead=shared.claims_ahead
            if shared is not None and isinstance(clock, ClusterClock)
            else None,
        )
        self._runs.sync.on_thread_free = self._thread_freed
        self._recorder.after_release = self._dispatcher.after_release
        self._recovery = Recovery(
            backend=backend,
            registry=self.registry,
            recorder=self._recorder,
            retries=self._retries,
            observer=self.observer,
            queue_backlogs=self._dispatcher.queue_backlogs,
        )
        self.cluster = ClusterWatch(backend, self.registry, self.observer, health)
        self._finishes = backend if isinstance(backend, LastFinishes) else None
        self._membership = Membership(shared, health, self._background)
        # The registry hears at once that a job expects no more ticks.
        self.registry.retired = lambda name: self.cluster.job_changed("retired", name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._pokes = Wakeup()
        self._quiet_changed: asyncio.Event | None = None
        self._asleep = False
        self._asleep_until: datetime | None = None
        self._main: asyncio.Task[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._prepare_handle: asyncio.TimerHandle | None = None
        self._prepare_for: datetime | None = None  # the instant _prepare_handle plans
        self._stepping: list[Tick] = []  # due and missed ticks of the step under way

    # ---- life cycle (on the loop) ------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.life.running

    async def start(self) -> None:
        self.life.begin()
        self._loop = loop = asyncio.get_running_loop()
        self._wake, self._quiet_changed = asyncio.Event(), asyncio.Event()
        self._stopped = loop.create_future()
        self._background.open(loop)
        await self.backend.open(self.replica_id, self._runs.lock_lost)
        self._runs.open(loop)
        self.life.phase = "running"
        self.registry.start()  # plans each job's ticks strictly after its now, all before:
        await self._membership.join(self.clock.now())
        await self.cluster.start()
        self._main = loop.create_task(self._run_loop(), name="replicron-engine")
        jobs = len(self.registry)
        self.observer.log(_INFO, "scheduler_started", f"scheduler started ({jobs} jobs)")
        self.observer.notify("on_started", self.replica_id)

    def close_unstarted(self) -> None:
        if self.life.phase == "new":
            self.life.phase = "stopped"

    async def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop claiming ticks, let runs finish for up to ``timeout`` seconds, then cancel
        and signal the rest; release every lock. Idempotent."""
        if self.life.phase == "new":
            self.close_unstarted()
            return
        assert self._stopped is not None
        assert self._main is not None
        if self.life.phase != "running":
            if not wait:  # a shutdown under way that waits for the runs: it waits no more
                self.stop_waiting()
            await asyncio.shield(self._stopped)
            return
        self.life.phase = "stopping"
        self._poke()
        limit = self.stop_timeout if timeout is None else timeout
        # One deadline for the whole stop; the runs going on are told it (a command job's
        # group gets SIGTERM its kill_grace before it, SIGKILL at it).
        waits = wait and _current.get(None) is None
        stop_by = time.monotonic() + limit
        self._runs.stopping(stop_by if waits else time.monotonic())
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
        staying = await self._membership.leave(max(0.0, stop_by - time.monotonic()))
        self._dispatcher.drop_waiting()
        await self.cluster.stop()
        for job, asked_at in self.registry.drop_manual():
            self.observer.log(
                _WARNING,
                "missed",
                "a manual run asked for (run_now) was not run: the scheduler shut down first",
                job,
                asked_at,
            )
        if waits:
            await self._runs.wait_finished(max(0.0, stop_by - time.monotonic()))
        await self._hand_over_deferred(max(0.0, stop_by - time.monotonic()), staying)
        # What was told to stop gets a moment to do so, even with wait=False: long enough for
        # a task that honours cancellation, short enough not to hold a shutdown up.
        grace = min(limit, _CANCEL_GRACE) if wait else _CANCEL_GRACE_NO_WAIT
        await self._runs.abandon_all(grace)
        await self._recorder.flush()
        if self._retries.unhandled:
            await self._recovery.record_unhandled_at_stop(limit)
        self.observer.notify("on_stopped", self.replica_id)
        await self._background.wait(limit)
        await self.backend.close()
        await self._runs.stop_workers(min(grace, _CANCEL_GRACE_NO_WAIT))
        self.life.phase = "stopped"
        self._stopped.set_result(None)
        self.observer.log(_INFO, "scheduler_stopped", "scheduler stopped")

    def stop_waiting(self) -> None:
        """A shutdown under way cuts the runs going on off now instead of letting them
        finish (a second SIGTERM to the daemon, say)."""
        self._runs.stop_waiting()

    async def _hand_over_deferred(
        self, limit: float, staying: Mapping[str, datetime] | None
    ) -> None:
        """Ticks left for replicas with free threads, and not taken by this one. A replica
        that stays and was planning at a tick's instant holds it too (each replica defers
        what it did not claim), and claims it as its threads free up: a rolling restart
        loses none. The others are recorded missed (the whole cluster stops, or those that
        stay joined after the tick); where the backend cannot tell who stays, the others get
        a moment to claim them first."""
        spreader = self._dispatcher.spreader
        if not spreader:
            return
        if staying is None:  # others may be there to take them
            await asyncio.sleep(min(limit, _HAND_OVER))
        handed, left = held_by_staying(spreader.take_all(), staying or {})
        if handed:
            self.observer.log(
                _INFO,
                "handed_over",
                f"{len(handed)} ticks left for the replicas that stay "
                f"({', '.join(sorted(staying or ()))})",
            )
        if not left:
            return
        why = (
            "left for a replica with a free worker thread; none took it before shutdown"
            if not staying
            else "left for a replica with a free worker thread; the replicas "
            "that stay joined after it was due, so none of them holds it"
        )
        missed = self._recovery.record_missed(left, {}, why)
        if await self._guarded(missed, left, RECORDING_MISSED) is _FAILED:
            self._retries.unhandle(left, self.clock.now())

    # ---- the loop ----------------------------------------------------------------------

    async def _run_loop(self) -> None:
        try:
            while self.life.running:
                await self._sleep(await self._step())
        finally:
            self._runs.sync.release_collector()  # however the loop ends (cancelled, say)

    async def _step(self) -> datetime | None:
        """Handle what is due now; returns when to wake next. A step of its own so that
        nothing of an instant (its thousands of ticks, say) stays referenced while the loop
        sleeps: kept for a second, they would grow the collector's oldest generation."""
        assert self._wake is not None
        self._wake.clear()
        now = self.clock.now()
        lead = self._dispatcher.lead()
        # Fixed-delay jobs: their next ticks first. Read at the clock's time, not a claim
        # lead ahead: a first tick is confirmed by a read at its very instant.
        await self._read_chains(now)
        decision, catch_up, manual = self.registry.take_due(now + lead)
        immediate: list[Tick] = []
        catch_up, since = self.leadership.step(catch_up, now, immediate)
        retries = self._retries
        immediate += retries.early_due(now)
        # Each part is guarded on its own: a backend failure must not stop the scheduler,
        # and failing to record a miss must not keep due ticks from running. What failed is
        # handled again once the backend answers: no tick is dropped with a failed statement.
        retries.new_step()
        if catch_up:
            found = await self._guarded(
                self._recovery.catch_up(catch_up, now, since), [], CATCHING_UP
            )
            if isinstance(found, _Failed):
                self.registry.catch_up_later(catch_up)
                retries.retry_backend(now)
            else:
                immediate += found
        if retries.unhandled:
            immediate += await self._recovery.resync(now, {tick.job for tick in decision.due})
        due, replaced = self._dispatcher.within_capacity(self.leadership.sift(immediate, decision))
        self._stepping = due + decision.missed + replaced
        if due:
            if immediate:
                due = list(dict.fromkeys(due))  # a tick both resynced and due: claimed once
            if await self._guarded(self._dispatcher.dispatch(due), due, CLAIMING) is _FAILED:
                retries.unhandle(due, now)
        if manual:
            claimed = self._dispatcher.dispatch(manual, manual=True)
            if await self._guarded(claimed, manual, CLAIMING_MANUAL) is _FAILED:
                self.registry.manual_again(manual)
                retries.retry_backend(now)
        if decision.missed or decision.older_missed:
            older = decision.older_missed
            missed = self._recovery.record_missed(decision.missed, older, "a later tick was due")
            if await self._guarded(missed, decision.missed, RECORDING_MISSED) is _FAILED:
                spans = [Tick(job, span.first) for job, span in older.items()]
                retries.unhandle(spans + decision.missed, now)
        if replaced:
            why = "a later tick was due before any replica had a free worker thread for it"
            missed = self._recovery.record_missed(replaced, {}, why)
            if await self._guarded(missed, replaced, RECORDING_MISSED) is _FAILED:
                retries.unhandle(replaced, now)
        self._stepping = []
        self._runs.expire(self.clock.now())
        wake_at = self.registry.wake_at()
        self._prepare_soon(wake_at)
        if wake_at is not None:
            wake_at -= lead
        others = (self._runs.next_deadline(), self._dispatcher.claim_more_at())
        for at in (*others, self.registry.chain_read_at()):
            if at is not None and (wake_at is None or at < wake_at):
                wake_at = at
        return retries.wake_at(wake_at)

    async def _read_chains(self, now: datetime) -> None:
        """Read the last finish of each fixed-delay job that needs it at ``now`` (one
        statement for them all) and plan its next tick. A failed read is told to the health,
        and tried again at the job's next read (its tick waits: no finish, no tick)."""
        jobs = self.registry.chains_to_read(now)
        if not jobs or self._finishes is None:
            return
        try:
            found = await self._finishes.last_finishes(jobs)
        except Exception as exc:
            self.health.failed(exc, _READING_FINISHES)
            return
        self.health.answered(_READING_FINISHES)
        self.registry.chains_learned(jobs, found, now)

    def _thread_freed(self) -> None:
        """A sync run ended: claim more of the ticks left for others, if enough threads
        are free for it."""
        if self._dispatcher.worth_claiming_more() and self.life.running:
            self._poke()

    async def _guarded(self, step: Awaitable[_T], ticks: list[Tick], doing: str) -> _T | _Failed:
        """``step``'s result, or ``_FAILED`` if the backend failed it while ``doing`` it
        (said by the health, and told to the listeners as a lock error for ``ticks``)."""
        try:
            return await step
        except Exception as exc:
            self._recorder.lock_error(ticks, exc, doing)
            return _FAILED

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
        if not self.life.running:
            return
        if self._runs.sync.backlogged:  # the last burst is still being worked off: it goes first
            self._prepare_soon(self.registry.wake_at())
            return
        self._dispatcher.prepare(self.registry.prepare())

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

    def _job_changed(self, hook: str, name: str) -> None:
        """A job was added, updated or removed (any thread): told to the listeners on the
        loop, while the scheduler runs."""
        self.leadership.job_changed(name)
        loop = self._loop
        if loop is not None and self.life.running and self.cluster.supported:
            if hook != "on_job_removed":  # the registry reads what was added when it looks
                self.cluster.changed_soon(loop)
            else:
                with contextlib.suppress(RuntimeError):  # loop closed in between
                    loop.call_soon_threadsafe(self.cluster.job_changed, hook, name)
        if not self.observer.listeners or loop is None or not self.life.running:
            return  # (jobs added in bulk with no listener must not wake the loop each time)
        with contextlib.suppress(RuntimeError):  # loop closed in between
            loop.call_soon_threadsafe(self.observer.notify, hook, name)

    def _poke(self) -> None:
        """Wake the loop after a change (any thread); one pending wake-up serves any number
        of calls."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            self._pokes(loop, wake)

    # ---- quiet: nothing left to do at the clock's current time -------------------------

    async def wait_idle(self) -> None:
        """Return once nothing is left to do at the clock's current time: every due tick
        handled, no run active or waiting, every outcome recorded."""
        assert self._quiet_changed is not None
        while not self._is_quiet():
            self._quiet_changed.clear()
            await self._quiet_changed.wait()

    def _is_quiet(self) -> bool:
        if not self.life.running:
            return True
        assert self._wake is not None
        # A wake-up asked for but not yet delivered (a manual run asked for again as the loop
        # went to sleep) is work to do.
        if not self._asleep or self._wake.is_set() or self._pokes.pending:
            return False
        if self._asleep_until is not None and self._asleep_until <= self.clock.now():
            return False
        dispatcher = self._dispatcher
        return not (
            self._runs
            or dispatcher.waiting
            or dispatcher.spreader
            or self._recorder
            or self._background
        )

    def _quiet_may_have_changed(self) -> None:
        if self._quiet_changed is not None:
            self._quiet_changed.set()
