"""The in-process backend: the default, and several schedulers in one process.

Each :class:`MemoryBackend` is one replica's handle; handles built on the same
:class:`MemoryState` coordinate with each other exactly as replicas sharing a database do
(useful in tests). State lives in memory only: nothing survives the process.
"""

from __future__ import annotations

import dataclasses
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from replicron.cluster import (
    ClusterStatus,
    JobDefinition,
    JobStatus,
    Pause,
    Registration,
    ReplicaStatus,
    build_status,
)
from replicron.events import Outcome

from .base import (
    Claim,
    ClaimRequest,
    ClaimStatus,
    LastFinish,
    PackedRecord,
    Release,
    RunRecord,
    pack_record,
    unpack_record,
)
from .leadership import Leader

__all__ = ["MemoryBackend", "MemoryState"]

#: Claimed ticks remembered per job for the exactly-once check (8 bytes each). When there
#: are more, the earliest eighth is dropped (at once, rather than one per claim), and a claim
#: of a tick at or before a dropped one is refused as taken: never run twice. Dropping the
#: earliest, not the first claimed, keeps the ticks the job's next claims are near: a
#: ``catch_up="all"`` backlog (up to 1000 old ticks, claimed in one batch) claimed before or
#: among newer ticks leaves those newer ticks remembered.
TICKS_KEPT = 1024
#: Outcomes kept per job for :meth:`MemoryState.history` (packed, so that the collector
#: does not track them).
HISTORY_KEPT = 16
_CLAIMED, _TAKEN, _LOCKED = ClaimStatus.CLAIMED, ClaimStatus.TAKEN, ClaimStatus.LOCKED
_EXHAUSTED, _PAUSED = ClaimStatus.EXHAUSTED, ClaimStatus.PAUSED
#: Outcomes of a claimed tick that did not run: it does not count against ``max_runs``.
_NOT_RUN = frozenset(
    {Outcome.MISSED, Outcome.SKIPPED_OVERLAP, Outcome.SKIPPED_LIMIT, Outcome.PAUSED}
)
#: Named tuples built from a tuple of their fields without a Python-level call.
_new = tuple.__new__


@dataclass(slots=True)
class _JobState:
    # Claimed ticks as POSIX timestamps, ascending (a float keeps every microsecond apart
    # and in order), and the latest one dropped from them: the unique (job, tick) record.
    claimed: array[float] = field(default_factory=lambda: array("d"))
    dropped_up_to: float | None = None
    # Who holds the job's run lock: a replica id and a run id (two fields, not a tuple, so
    # that taking the lock allocates nothing).
    lock_replica: str | None = None
    lock_run_id: int | None = None
    last_run_id: int = 0
    last_tick: datetime | None = None  # of the trigger's ticks (not manual runs)
    # Scheduled runs claimed, less those recorded as not run: counted against max_runs.
    runs: int = 0
    # The latest tick of a scheduled run claimed: once the job has run its max_runs, its
    # ticks after this one are not ticks. (Kept when that run is recorded as not run, where
    # PostgreSQL's and the embedded ledger's go back to the run before it.)
    last_run: datetime | None = None
    history: deque[PackedRecord] = field(default_factory=lambda: deque(maxlen=HISTORY_KEPT))
    # The outcome of a tick of the trigger, kept however many manual runs follow it: the
    # latest one is what a fixed-delay job's next tick follows.
    last_tick_end: PackedRecord | None = None
    # Ranges of missed ticks, by their first tick's key: (last tick's key, how many ticks).
    # Both ends are in ``claimed`` too, so a claim of a tick inside one takes the slow path.
    ranges: dict[float, tuple[float, int]] = field(default_factory=dict)
    # The keys in ``claimed`` that are manual runs': not ticks of the job.
    manual_keys: set[float] = field(default_factory=set)

    def in_range(self, key: float) -> bool:
        return any(first <= key <= last for first, (last, _) in self.ranges.items())

    def has_range_within(self, first: float, last: float) -> bool:
        """Whether a range lies (partly) in ``first``..``last``, or that span reaches into
        the ticks dropped from ``claimed`` (what lies there is no longer known)."""
        dropped = self.dropped_up_to
        if dropped is not None and first <= dropped:
            return True
        return any(a <= last and first <= b for a, (b, _) in self.ranges.items())

    def ticks_held_within(self, first: float, last: float) -> int:
        """How many ticks in ``first``..``last`` have rows of their own (manual runs lie
        off the job's ticks; no range lies there)."""
        claimed = self.claimed
        held = bisect_right(claimed, last) - bisect_left(claimed, first)
        return held - sum(1 for key in self.manual_keys if first <= key <= last)

    def keep(self, record: RunRecord) -> None:
        packed = pack_record(record)
        self.history.append(packed)
        if not record.manual:
            end = self.last_tick_end
            if end is None or end[1] <= record.scheduled_at:
                self.last_tick_end = packed


class MemoryState:
    """Claims, locks and history shared by the :class:`MemoryBackend` handles built on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, _JobState] = {}
        #: Jobs paused across the handles: their ticks are recorded paused, none runs.
        self.paused: dict[str, Pause] = {}
        #: (job, replica id) -> what that handle's scheduler announced of the job.
        self.registry: dict[tuple[str, str], tuple[JobDefinition, datetime]] = {}
        #: job -> the handles that registered it (the registry's keys, by job).
        self.registered_by: dict[str, set[str]] = {}
        #: Handles open now, with when they opened.
        self.replicas: dict[str, datetime] = {}
        #: Leader mode: the handles that contend for the lease (what to tell each of a
        #: change), and who holds it. A holder keeps it until its handle closes.
        self.contenders: dict[str, Callable[[], None]] = {}
        self.leader: Leader | None = None

    def job(self, name: str) -> _JobState:
        state = self.jobs.get(name)
        if state is None:
            state = self.jobs[name] = _JobState()
        return state

    def history(self, job: str) -> list[RunRecord]:
        """Recorded outcomes of ``job``, oldest first (the last HISTORY_KEPT)."""
        with self.lock:
            return [unpack_record(packed) for packed in self.job(job).history]

    def locks_held(self) -> dict[str, tuple[str, int]]:
        """Job name -> (replica id, run id) for every run lock held now."""
        with self.lock:
            return {
                name: (job.lock_replica, job.lock_run_id)
                for name, job in self.jobs.items()
                if job.lock_replica is not None and job.lock_run_id is not None
            }


class MemoryBackend:
    """One replica's handle on a :class:`MemoryState` (a private one by default)."""

    def __init__(self, state: MemoryState | None = None) -> None:
        self.state = MemoryState() if state is None else state
        self.replica_id = ""

    def register_job(self, name: str) -> None:
        pass  # names are the keys here: nothing can collide

    def unregister_job(self, name: str) -> None:
        pass

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        self.replica_id = replica_id
        with self.state.lock:
            self.state.replicas[replica_id] = datetime.now(UTC)

    def contend(self, on_change: Callable[[], None]) -> None:
        """Contend for the lease: it is this handle's at once if nobody holds it."""
        state = self.state
        with state.lock:
            state.contenders[self.replica_id] = on_change
            took = state.leader is None
            if took:
                state.leader = Leader(self.replica_id, 1)
        if took:
            on_change()

    def leading(self) -> bool:
        leader = self.state.leader
        return leader is not None and leader.holder == self.replica_id

    @property
    def leader(self) -> Leader | None:
        return self.state.leader

    def _resign(self) -> None:
        """The handle closes: the lease goes to another contender, if any is left."""
        state = self.state
        with state.lock:
            state.contenders.pop(self.replica_id, None)
            leader = state.leader
            if leader is None or leader.holder != self.replica_id:
                return
            heir = min(state.contenders, default=None)
            state.leader = None if heir is None else Leader(heir, leader.epoch + 1)
            told = list(state.contenders.values())
        for on_change in told:
            on_change()

    async def close(self) -> None:
        self._resign()
        with self.state.lock:
            self.state.replicas.pop(self.replica_id, None)
            for job in self.state.jobs.values():
                if job.lock_replica == self.replica_id:
                    job.lock_replica = job.lock_run_id = None

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        # Once per tick of a burst, before its runs can start: kept lean. The usual tick is
        # the newest of its job, and the ticks of one instant are one datetime object, whose
        # timestamp is worked out once.
        claims: list[Claim] = []
        add, take, replica, state = claims.append, self._take_tick, self.replica_id, self.state
        jobs, new_job, paused = state.jobs, state.job, state.paused
        last_tick: datetime | None = None
        key = 0.0
        with state.lock:
            for name, tick, lock, manual, max_runs in requests:
                job = jobs.get(name) or new_job(name)
                if max_runs is not None and not manual and job.runs >= max_runs:
                    add(_new(Claim, (name, tick, _EXHAUSTED, None, False, False)))
                    continue
                if tick is not last_tick:
                    last_tick, key = tick, tick.timestamp()
                claimed = job.claimed
                if claimed and key > claimed[-1] and len(claimed) < TICKS_KEPT and not manual:
                    claimed.append(key)  # the newest tick of the job: _take_tick's usual case
                    job.last_tick = tick
                elif not take(job, tick, key, manual):
                    add(_new(Claim, (name, tick, _TAKEN, None, False, manual)))
                    continue
                if paused and name in paused and not manual:
                    job.last_run_id = run_id = job.last_run_id + 1
                    record = RunRecord(
                        name,
                        tick,
                        Outcome.PAUSED,
                        replica,
                        run_id,
                        None,
                        None,
                        "the job is paused",
                    )
                    job.keep(record)
                    add(_new(Claim, (name, tick, _PAUSED, run_id, False, manual)))
                    continue
                if lock and job.lock_replica is not None:
                    add(_new(Claim, (name, tick, _LOCKED, None, False, manual)))
                else:
                    job.last_run_id = run_id = job.last_run_id + 1
                    if lock:
                        job.lock_replica, job.lock_run_id = replica, run_id
                    if not manual:
                        job.runs += 1
                        if job.last_run is None or tick > job.last_run:
                            job.last_run = tick
                    add(_new(Claim, (name, tick, _CLAIMED, run_id, lock, manual)))
        return claims

    def _take_tick(
        self, job: _JobState, tick: datetime, key: float | None = None, manual: bool = False
    ) -> bool:
        """Insert the tick unless anybody has it: the unique ``(job, tick)`` record."""
        claimed, dropped = job.claimed, job.dropped_up_to
        if key is None:
            key = tick.timestamp()
        if dropped is not None and key <= dropped:
            return False
        if not claimed or key > claimed[-1]:  # the usual case: the newest tick so far
            claimed.append(key)
        else:
            at = bisect_left(claimed, key)
            if at < len(claimed) and claimed[at] == key:
                return False
            if job.ranges and job.in_range(key):
                return False
            claimed.insert(at, key)
        if manual:
            job.manual_keys.add(key)
        if len(claimed) > TICKS_KEPT:
            drop = max(1, TICKS_KEPT // 8)
            job.dropped_up_to = dropped = claimed[drop - 1]
            del claimed[:drop]
            if job.manual_keys:
                job.manual_keys = {k for k in job.manual_keys if k > dropped}
        last = job.last_tick
        if not manual and (last is None or tick > last):
            job.last_tick = tick
        return True

    async def lock(self, claim: Claim) -> bool:
        with self.state.lock:
            job = self.state.job(claim.job)
            if job.lock_replica is not None:
                return False
            assert claim.run_id is not None
            job.lock_replica, job.lock_run_id = self.replica_id, claim.run_id
            return True

    async def release(self, releases: Sequence[Release]) -> None:
        replica = self.replica_id
        with self.state.lock:
            for record, unlock in releases:
                job = self.state.job(record.job)
                job.keep(record)
                if record.outcome in _NOT_RUN and record.run_id is not None and not record.manual:
                    job.runs -= 1
                if unlock and job.lock_run_id == record.run_id and job.lock_replica == replica:
                    job.lock_replica = job.lock_run_id = None

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        done: list[int | None] = []
        with self.state.lock:
            for record in records:
                job = self.state.job(record.job)
                limit = record.max_runs
                if limit is not None and not record.manual and job.runs >= limit:
                    last_run = job.last_run
                    if last_run is None or record.scheduled_at > last_run:
                        done.append(False)  # after its last run, the job has no more ticks
                        continue
                if record.through is None:
                    if self._take_tick(job, record.scheduled_at):
                        job.keep(record)
                        done.append(True)
                    else:
                        done.append(False)
                    continue
                written = self._take_range(job, record)
                if written is not None:
                    job.keep(written)
                done.append(False if written is None else written.ticks)
        return done

    def _take_range(self, job: _JobState, record: RunRecord) -> RunRecord | None:
        """Insert a range of missed ticks, keyed by its first start with no row and standing
        for the ticks of its span without rows of their own, unless another range lies in
        its span; the record written."""
        assert record.through is not None
        first_key, last_key = record.scheduled_at.timestamp(), record.through.timestamp()
        if job.has_range_within(first_key, last_key):
            return None
        claimed = job.claimed
        for start in record.starts or (record.scheduled_at,):
            key = start.timestamp()
            at = bisect_left(claimed, key)
            if at == len(claimed) or claimed[at] != key:
                break
        else:
            return None  # every start has a row: where the range would begin is unknown
        ticks = record.ticks - job.ticks_held_within(first_key, last_key)
        for end in (key, last_key):
            claimed.insert(bisect_left(claimed, end), end)
        job.ranges[key] = (last_key, ticks)
        if job.last_tick is None or record.through > job.last_tick:
            job.last_tick = record.through
        return record._replace(scheduled_at=start, ticks=ticks)

    def clock_offset(self) -> timedelta | None:
        return None  # the processes share this host's clock

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        """Each job's latest tick; for a job with none that a handle registered, the instant
        just before the first tick a registration of it expects (see ``Backend.last_ticks``)."""
        found: dict[str, datetime] = {}
        with self.state.lock:
            for name in jobs:
                job = self.state.jobs.get(name)
                if job is not None and job.last_tick is not None:
                    found[name] = job.last_tick
                    continue
                registrations = (
                    self.state.registry[name, who][0]
                    for who in self.state.registered_by.get(name, ())
                )
                firsts = [d.expected[0] for d in registrations if d.expected]
                if firsts:
                    found[name] = min(firsts) - timedelta(microseconds=1)
        return found

    async def last_finishes(self, jobs: Sequence[str]) -> dict[str, LastFinish]:
        found: dict[str, LastFinish] = {}
        with self.state.lock:
            for name in jobs:
                job = self.state.jobs.get(name)
                if job is None or job.last_tick is None:
                    continue
                tick, end = job.last_tick, job.last_tick_end
                ended = None if end is None or end[1] != tick else unpack_record(end)
                found[name] = (
                    LastFinish(tick, None, None)
                    if ended is None
                    else LastFinish(tick, ended.finished_at, ended.outcome)
                )
        return found

    # ---- the cluster's registry, pauses and status --------------------------------------

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Note what this replica schedules (with ``complete``, all of it); returns the
        registrations of its jobs by live handles that differ from its own (drift)."""
        now = datetime.now(UTC)
        replica, state = self.replica_id, self.state
        with state.lock:
            if complete:
                removed = [job for job, who in state.registry if who == replica]
            for name in removed:
                state.registry.pop((name, replica), None)
                state.registered_by.get(name, set()).discard(replica)
            for definition in definitions:
                state.registry[definition.job, replica] = (definition, now)
                state.registered_by.setdefault(definition.job, set()).add(replica)
            mine = {
                job: d.fingerprint
                for (job, who), (d, _) in state.registry.items()
                if who == replica
            }
            return [
                _registration(d, who, seen, True)
                for (job, who), (d, seen) in state.registry.items()
                if who != replica
                and who in state.replicas
                and job in mine
                and d.fingerprint != mine[job]
            ]

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` for every handle; False if it was paused already."""
        with self.state.lock:
            if job in self.state.paused:
                return False
            self.state.paused[job] = Pause(job, datetime.now(UTC), by)
            return True

    async def resume(self, job: str) -> bool:
        """Resume ``job``; False if it was not paused."""
        with self.state.lock:
            return self.state.paused.pop(job, None) is not None

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """Drop the registrations of ``job`` by handles that closed: (those dropped, the
        open handles that still schedule it)."""
        with self.state.lock:
            replicas = sorted(who for name, who in self.state.registry if name == job)
            gone = [who for who in replicas if who not in self.state.replicas]
            for who in gone:
                del self.state.registry[job, who]
                self.state.registered_by[job].discard(who)
        return gone, [who for who in replicas if who not in gone]

    async def cluster_status(self) -> ClusterStatus:
        now = datetime.now(UTC)
        state = self.state
        with state.lock:
            ledger = [_job_status(name, job) for name, job in state.jobs.items()]
            registrations = [
                _registration(d, who, seen, who in state.replicas)
                for (_, who), (d, seen) in state.registry.items()
            ]
            replicas = [
                ReplicaStatus(who, None, None, started, now, True)
                for who, started in state.replicas.items()
            ]
            pauses = list(state.paused.values())
        status = build_status("", now, ledger, registrations, pauses, replicas)
        leader = self.state.leader
        return dataclasses.replace(status, leader=None if leader is None else leader.holder)


def _registration(
    definition: JobDefinition, replica: str, seen: datetime, alive: bool
) -> Registration:
    d = definition
    return Registration(d.job, replica, d.trigger, d.fingerprint, d.grace, d.expected, seen, alive)


def _job_status(name: str, job: _JobState) -> JobStatus:
    """What the kept history tells of ``job`` (the last HISTORY_KEPT outcomes)."""
    history = [unpack_record(packed) for packed in job.history]
    last = max(history, key=lambda r: r.scheduled_at, default=None)
    successes = [
        r.finished_at
        for r in history
        if r.outcome is Outcome.SUCCEEDED and r.finished_at is not None
    ]
    running: tuple[tuple[str, int], ...] = ()
    if job.lock_replica is not None and job.lock_run_id is not None:
        running = ((job.lock_replica, job.lock_run_id),)
    return JobStatus(
        name,
        last.replica_id if last else None,
        last.scheduled_at if last else None,
        last.started_at if last else None,
        last.finished_at if last else None,
        last.outcome.value if last else None,
        last.error if last else None,
        max(successes, default=None),
        running,
        sum(
            job.ranges.get(r.scheduled_at.timestamp(), (0.0, 1))[1]
            for r in history
            if r.outcome is Outcome.MISSED
        ),
        (),
        job.last_tick,
    )
