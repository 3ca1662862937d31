"""Dispatch: the due ticks of a step claimed from the backend in one batch, and each answer
turned into a run, a record, or a tick waiting for its turn (overlap and concurrency limit)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Literal

from replicron.backends.base import (
    Backend,
    Claim,
    ClaimRequest,
    ClaimStatus,
    RunRecord,
    SharedCoordination,
)
from replicron.clock import Clock
from replicron.events import Outcome, RunEvent

from .capacity import Spreader, claim_margin
from .health import CLAIMING, CLAIMING_MANUAL
from .leadership import Leadership
from .observe import Observer
from .planner import Tick, overlap_action
from .recorder import Recorder
from .registry import JobRegistry, JobState
from .retries import Retries
from .runs import RunExecutor

__all__ = ["ConcurrencyMode", "Dispatcher", "TickAction"]

_DEBUG, _INFO = logging.DEBUG, logging.INFO
ConcurrencyMode = Literal["queue", "skip"]
#: What the engine does with a claimed tick: the overlap policy's answer, or the limit's.
#: "abandon": claimed ahead, and its lock or lease was lost before its instant. "backlog": a
#: tick of a catch-up backlog, claimed without the lock, that waits for its turn.
TickAction = Literal["run", "skip", "queue", "limit_skip", "limit_queue", "abandon", "backlog"]
_NO_LEAD = timedelta(0)
#: The shortest lead when claiming ahead (seconds), and how many claims' times it follows.
_MIN_LEAD, _CLAIMS_TIMED = 0.005, 16
#: Sleeps at most while waiting for an instant claimed ahead (each re-checks the clock).
_WAIT_SLICES = 4
#: Named tuples built from a tuple of their fields without a Python-level call.
_new = tuple.__new__


class Dispatcher:
    """Owns the ticks waiting for a slot under ``max_concurrent_jobs``; a job's one queued
    tick (overlap "queue") and catch-up backlog live in its ``JobState``."""

    def __init__(
        self,
        *,
        backend: Backend,
        clock: Clock,
        registry: JobRegistry,
        runs: RunExecutor,
        recorder: Recorder,
        retries: Retries,
        observer: Observer,
        max_concurrent_jobs: int | None,
        concurrency_mode: ConcurrencyMode,
        shared: SharedCoordination | None,
        claim_ahead: timedelta | None,
        leadership: Leadership | None = None,
    ) -> None:
        self._backend, self._clock, self._registry = backend, clock, registry
        self._runs, self._recorder, self._retries, self._observer = (
            runs,
            recorder,
            retries,
            observer,
        )
        self.max_concurrent_jobs = max_concurrent_jobs
        self.concurrency_mode = concurrency_mode
        self.waiting: deque[tuple[JobState, Claim]] = deque()  # concurrency limit "queue"
        self._prepared: dict[str, ClaimRequest] = {}  # job -> its request, made ahead
        self._prepared_at: datetime | None = None
        # Claiming ahead: up to this far before a tick (seconds; 0: never), by twice the
        # slowest of the last claims' round trips.
        self._ahead_limit = 0.0 if claim_ahead is None else claim_ahead.total_seconds()
        self._claim_times: deque[float] = deque(maxlen=_CLAIMS_TIMED)
        #: Claim by capacity (the backend is shared by replicas in other processes).
        self._shared = shared if shared is not None and shared.spreads_bursts else None
        spreader = None if self._shared is None else Spreader(observer.replica_id)
        self.spreader = spreader if leadership is None else leadership.adopt(spreader)

    def prepare(self, ticks: list[Tick]) -> None:
        """Make, while idle, what claiming and starting the next instant's ``ticks`` will
        need: a claim request and a run each. Made then, their allocations (and the
        collector passes that many allocations bring about) fall outside the burst, and the
        burst has less to do. Called again as jobs join the instant."""
        if not ticks:
            return
        at = ticks[0].scheduled_at
        if at != self._prepared_at:  # a new instant: what was made for another one goes
            self._prepared.clear()
            self._runs.forget_prepared()
            self._prepared_at = at
        prepared, get, prepare_run = self._prepared, self._registry.get, self._runs.prepare
        for job, tick in ticks:
            if job in prepared or (state := get(job)) is None:
                continue
            spec = state.spec
            prepared[job] = _new(
                ClaimRequest, (job, tick, spec.overlap != "allow", False, spec.max_runs)
            )
            prepare_run(state, tick)

    def lead(self) -> timedelta:
        """How long before an instant to claim its ticks, so that the claim's round trip
        (its commit, on a server that syncs to disk) is over when they are due, and the runs
        start on time: twice the slowest of the last claims, within the backend's limit."""
        limit = self._ahead_limit
        if not limit:
            return _NO_LEAD
        slowest = self._slowest_claim() or limit
        return timedelta(seconds=min(limit, max(_MIN_LEAD, 2 * slowest)))

    def within_capacity(self, ticks: list[Tick]) -> tuple[list[Tick], list[Tick]]:
        """Of ``ticks`` and the ticks left for other replicas before: those to claim now
        (all of them unless the backend is shared), and those left before that their jobs'
        newer ticks replaced (see ``capacity``)."""
        spreader, shared = self.spreader, self._shared
        if spreader is None or shared is None:
            return ticks, []
        spreader.see_peers(shared.peers or frozenset())
        room = self.room()
        if not spreader and len(ticks) <= room and not spreader.holds_back:
            return ticks, []  # the common case: nothing to weigh
        return spreader.split(ticks, room, self._needs_thread, self._clock.now())

    def room(self) -> int:
        """Runs that would take a worker thread this replica can start promptly, within
        ``max_concurrent_jobs`` when ticks over it wait (they may as well wait elsewhere)."""
        runs = self._runs
        sync = runs.sync
        margin = claim_margin(sync.workers, self._slowest_claim(), sync.run_seconds)
        room = sync.workers + margin - sync.threads_taken
        limit = self.max_concurrent_jobs
        if limit is not None and self.concurrency_mode == "queue":
            room = min(room, limit - len(self._runs.active) - len(self.waiting))
        return room

    def _slowest_claim(self) -> float | None:
        """The slowest of the last claims' round trips (seconds), None before the first."""
        return max(self._claim_times, default=None)

    def worth_claiming_more(self) -> bool:
        """Ticks were left for others, some may be claimed now, and half the threads are
        free to run them: a thread freed up (a claim for each run that ends would be too
        many)."""
        spreader = self.spreader
        if not spreader or spreader.all_held(self._clock.now()):
            return False
        return self.room() >= max(1, self._runs.sync.workers // 2)

    def claim_more_at(self) -> datetime | None:
        """Right after a claim: when to claim more of the ticks left for others. Now, if
        there is room for any (others took some of this claim's), at the instant of those
        held back for their first replicas, or once threads free up (None)."""
        spreader = self.spreader
        if not spreader:
            return None
        now = self._clock.now()
        if spreader.all_held(now):
            return spreader.held_until
        return now if self.room() >= 1 else None

    def _needs_thread(self, job: str) -> bool:
        state = self._registry.get(job)
        if state is None:
            return False
        spec = state.spec
        return not spec.is_async and not (state.running and spec.overlap != "allow")

    async def dispatch(self, ticks: list[Tick], manual: bool = False) -> None:
        """Claim ``ticks`` and start, record or queue each; ``manual``: they are manual runs
        (``run_now``) rather than ticks of their jobs' triggers."""
        # These loops run once per tick of a burst, thousands of times at one instant, before
        # the last run of the burst can begin: keep them lean.
        requests: list[ClaimRequest] = []
        states: list[JobState] = []
        unusual: dict[int, TickAction] = {}  # position -> action, where it is not simply "run"
        limit, jobs_get = self.max_concurrent_jobs, self._registry.get
        active = len(self._runs.active) + len(self.waiting)
        add_request, add_state = requests.append, states.append
        prepared, prepared_get = self._prepared, self._prepared.get
        for job, scheduled_at in ticks:
            state = jobs_get(job)
            if state is None:
                continue
            spec = state.spec
            lock, max_runs = spec.overlap != "allow", spec.max_runs
            if state.running or limit is not None:
                action = self._action(state, active)
                if action == "run" or action == "limit_queue":
                    active += 1
                else:
                    lock = False
                if action != "run":
                    unusual[len(states)] = action
            request = prepared_get(job)
            if (
                request is not None
                and request[1] is scheduled_at
                and request[2] is lock
                and request[4] is max_runs
                and not manual
            ):
                del prepared[job]
            else:
                request = _new(ClaimRequest, (job, scheduled_at, lock, manual, max_runs))
            add_request(request)
            add_state(state)
        if not requests:
            return
        lost = self._runs.lost_unstarted
        lost.clear()
        sent = time.monotonic()
        claims = await self._backend.claim(requests)
        self._recorder.health.answered(CLAIMING_MANUAL if manual else CLAIMING)
        self._claim_times.append(time.monotonic() - sent)
        if self._ahead_limit:
            await self._until(max(tick.scheduled_at for tick in ticks))
        if lost:  # the lock session or the lease was lost since the claim: run none of them
            for index, claim in enumerate(claims):
                if claim.run_id in lost:
                    unusual[index] = "abandon"
            lost.clear()
        # Thousands of objects, no longer needed while the runs start: the collector counts
        # them until they go.
        del requests, add_request
        runs = self._runs
        runs.hold_collector()  # if asked to: only now, with the claims in hand
        try:
            now = self._clock.now()
            if unusual:
                for index, (state, claim) in enumerate(zip(states, claims, strict=True)):
                    self._settle(state, claim, unusual.get(index, "run"), now)
            else:
                start, claimed = runs.start, ClaimStatus.CLAIMED
                for state, claim in zip(states, claims, strict=True):
                    if claim.status is claimed:
                        start(state, claim, now)
                    else:
                        self._settle(state, claim, "run", now)
            runs.sync.submit_all()  # hand the instant's sync runs over before anything else
        finally:
            runs.release_collector_once_started()

    async def queue_backlogs(self, backlogs: Mapping[str, Sequence[datetime]]) -> None:
        """Catch-up backlogs (``catch_up="all"``): every tick of each job's backlog claimed
        now, in one batch and without the job's lock, then run one after another, oldest
        first, each taking the lock when its turn comes, as a queued tick does. From the
        claim on each tick has its row, held (heartbeated) by this replica: a stop records
        those not run missed (``drop_waiting``), and after a crash a janitor writes them off
        abandoned. Held only in memory, a stop or a crash would leave them without a record,
        and a restart, catching up from the job's latest tick, would never find them."""
        requests: list[ClaimRequest] = []
        states: list[JobState] = []
        for job, ticks in backlogs.items():
            if (state := self._registry.get(job)) is None:
                continue
            for tick in ticks:
                requests.append(ClaimRequest(job, tick, False, False, state.spec.max_runs))
                states.append(state)
        if not requests:
            return
        claims = await self._backend.claim(requests)
        self._recorder.health.answered(CLAIMING)
        now = self._clock.now()
        for state, claim in zip(states, claims, strict=True):
            self._settle(state, claim, "backlog", now)
        for job in backlogs:
            state = self._registry.get(job)
            if state is not None and state.backlog and not state.running:
                await self._start_queued(state)

    async def _until(self, due: datetime) -> None:
        """Claimed ahead: wait for the instant, so the runs start on time. On the loop only
        (a blocking fine sleep can fail, e.g. under a faked clock), and never raising: the
        ticks are claimed, and must start whatever happens to the wait."""
        clock = self._clock
        for _ in range(_WAIT_SLICES):
            try:
                remaining = (due - clock.now()).total_seconds()
                if remaining <= 0:
                    return
                await asyncio.sleep(remaining)
            except Exception:
                return

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
        status, record = claim.status, self._recorder.record
        if status is ClaimStatus.TAKEN and claim.manual:
            # Another replica's manual run of the job asked for at the same microsecond.
            self._registry.manual_taken(Tick(claim.job, claim.scheduled_at))
        elif status is ClaimStatus.TAKEN:
            observer = self._observer
            observer.log(_DEBUG, "taken", "another replica has it", claim.job, claim.scheduled_at)
            if observer.listeners:
                observer.notify(
                    "on_taken", RunEvent(claim.job, claim.scheduled_at, observer.replica_id)
                )
        elif status is ClaimStatus.LOCKED:
            record(state, claim, Outcome.SKIPPED_OVERLAP, "running on another replica")
        elif status is ClaimStatus.EARLY:
            self._observer.log(
                _DEBUG,
                "early",
                "not yet due by the backend's clock; asking again shortly",
                claim.job,
                claim.scheduled_at,
            )
            self._retries.early(Tick(claim.job, claim.scheduled_at), now)
        elif status is ClaimStatus.PAUSED:  # recorded by the claim: only told here
            paused = RunRecord(
                claim.job,
                claim.scheduled_at,
                Outcome.PAUSED,
                self._observer.replica_id,
                claim.run_id,
                None,
                None,
                "the job is paused",
                claim.manual,
            )
            self._recorder.report(paused, state, detail="the job is paused")
        elif status is ClaimStatus.EXHAUSTED and state.may_miss:
            self._observer.log(
                _INFO,
                "exhausted",
                f"max_runs ({state.spec.max_runs}) reached for now: a "
                "run of the job waiting for a worker thread may yet be missed, and the job go "
                "on",
                claim.job,
                claim.scheduled_at,
            )
        elif status is ClaimStatus.EXHAUSTED:
            self._registry.retire(claim.job, state)
            self._observer.log(
                _INFO,
                "exhausted",
                f"max_runs ({state.spec.max_runs}) reached across the "
                "replicas: the job has no more ticks",
                claim.job,
                claim.scheduled_at,
            )
        elif action == "abandon":
            why = "lost its lock with the backend session before it started; not run"
            record(state, claim, Outcome.ABANDONED, why, unlock=claim.locked)
        elif action == "backlog":
            if state.backlog is None:
                state.backlog = deque()
            state.backlog.append(claim)
        elif action == "run":
            self._runs.start(state, claim, now)
        elif action == "skip":
            record(state, claim, Outcome.SKIPPED_OVERLAP, "previous run still going")
        elif action == "limit_skip":
            record(state, claim, Outcome.SKIPPED_LIMIT, "max_concurrent_jobs reached")
        elif action == "limit_queue":
            self.waiting.append((state, claim))
        elif claim.manual:  # overlap "queue": every manual run asked for waits its turn
            if state.pending_manual is None:
                state.pending_manual = deque()
            state.pending_manual.append(claim)
        else:  # overlap "queue": keep one tick waiting; a newer one replaces it
            if state.pending is not None:
                record(state, state.pending, Outcome.MISSED, "a later tick was queued")
            state.pending = claim

    async def after_release(self, states: Sequence[JobState | None]) -> None:
        """Outcomes were written: start what waited for those runs to end."""
        self._registry.chains_finished(states)
        for state in states:
            if (
                state is not None
                and not state.running
                and (state.pending or state.pending_manual or state.backlog)
            ):
                await self._start_queued(state)
        self._start_waiting_for_a_slot()

    async def _start_queued(self, finished: JobState) -> None:
        """After a run of ``finished`` ended: a manual run waiting (the earliest asked for),
        else its queued tick, else its next catch-up tick. A catch-up tick that could not
        take the lock is the backlog's last try for now: the rest waits for the job's next
        run here to end, rather than being written off at once."""
        record = self._recorder.record
        while not finished.running:
            from_backlog = False
            if finished.pending_manual:
                pending = finished.pending_manual.popleft()
            elif finished.pending is not None:
                pending, finished.pending = finished.pending, None
            elif finished.backlog and self._registry.get(finished.spec.name) is not finished:
                # Removed since its backlog was claimed: what is left of it will not run.
                why = "the job was removed before its turn"
                self._recorder.record_claims_missed(finished, list(finished.backlog), why)
                finished.backlog = None
                break
            elif finished.backlog:
                pending, from_backlog = finished.backlog.popleft(), True
            else:
                break
            allow = finished.spec.overlap == "allow"
            try:
                locked = allow or await self._backend.lock(pending)
            except Exception as exc:
                record(finished, pending, Outcome.MISSED, f"could not take its lock: {exc}")
            else:
                if locked:
                    # Started, or recorded missed past its grace: then what waits goes on
                    # once that record has let the lock go (``then_next``), not before.
                    self._runs.start(finished, pending._replace(locked=not allow))
                    break
                record(finished, pending, Outcome.SKIPPED_OVERLAP, "running elsewhere")
            if from_backlog:
                break

    def _start_waiting_for_a_slot(self) -> None:
        limit, active = self.max_concurrent_jobs, self._runs.active
        while self.waiting and (limit is None or len(active) < limit):
            state, claim = self.waiting.popleft()
            self._runs.start(state, claim)

    def drop_waiting(self) -> None:
        """At shutdown: the ticks still waiting for their turn are recorded missed."""
        record = self._recorder.record
        for state, claim in self.waiting:
            record(state, claim, Outcome.MISSED, "scheduler shut down first", claim.locked)
        self.waiting.clear()
        for state in self._registry.states():
            for claim in state.pending_manual or ():
                record(state, claim, Outcome.MISSED, "scheduler shut down first")
            state.pending_manual = None
            if state.pending is not None:
                record(state, state.pending, Outcome.MISSED, "scheduler shut down first")
                state.pending = None
            if state.backlog:
                self._recorder.record_claims_missed(
                    state, list(state.backlog), "scheduler shut down first"
                )
            state.backlog = None
