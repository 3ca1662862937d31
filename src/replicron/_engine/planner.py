"""The scheduling decision, without I/O: which ticks are due, which were missed, when to wake.

Nothing here reads a clock, sleeps, touches a thread or a backend: every function takes
``now`` and returns a decision, so it is tested directly with plain datetimes.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NamedTuple

from replicron.backends.base import LastFinish
from replicron.triggers import IntervalTrigger, Trigger

from .chain import KEEP, Chain, chain_of

__all__ = [
    "MAX_ENUMERATED_TICKS",
    "RANGE_STARTS_OFFERED",
    "CatchUp",
    "Decision",
    "Planner",
    "Span",
    "Tick",
    "Walk",
    "catch_up_plan",
    "overlap_action",
    "resync_plan",
    "span_starts",
    "ticks_from",
    "walk",
]

#: How many consecutive missed ticks of one job are enumerated (and recorded) one by one:
#: the latest ones. Past that (a laptop suspended for days with a per-second job) the older
#: ones are one range record (first, last, count), so each tick still has exactly one record.
MAX_ENUMERATED_TICKS = 1000
#: How many of a range's first ticks its record offers as its key: a range is keyed by its
#: first tick with no row of its own (a claim whose answer was lost when the backend went
#: away, another replica's record), and only a run of that many such rows refuses it.
RANGE_STARTS_OFFERED = 64
_EPSILON = timedelta(microseconds=1)

CatchUp = Literal["latest", "none", "all"]
OverlapPolicy = Literal["skip", "queue", "allow"]


class Tick(NamedTuple):
    job: str
    scheduled_at: datetime


def _tick_time(tick: Tick) -> datetime:
    return tick.scheduled_at


class Span(NamedTuple):
    """Consecutive ticks of one job, ``first`` to ``last`` (both included), ``ticks`` of them."""

    first: datetime
    last: datetime
    ticks: int


def span_starts(trigger: Trigger, span: Span) -> tuple[datetime, ...]:
    """The first ticks of ``span`` (at most :data:`RANGE_STARTS_OFFERED`): where its range
    record may be keyed."""
    starts = [span.first]
    while len(starts) < min(span.ticks, RANGE_STARTS_OFFERED):
        tick = trigger.next_after(starts[-1])
        if tick is None or tick > span.last:
            break
        starts.append(tick)
    return tuple(starts)


class Walk(NamedTuple):
    """A trigger's ticks over a stretch of time: the latest :data:`MAX_ENUMERATED_TICKS`
    (``listed``, oldest first), the ones before them as one span (``older``, ``None`` when
    none are left out), and the trigger's first tick past the stretch (``after``)."""

    listed: list[datetime]
    older: Span | None
    after: datetime | None


@dataclass(slots=True)
class Decision:
    """What to do at ``now``: run ``due`` (oldest first), record ``missed``, then sleep until
    ``wake_at`` (``None``: no job has a future tick). A job that missed more ticks than
    :data:`MAX_ENUMERATED_TICKS` has its latest ones listed in ``missed`` and the older
    ones as one span in ``older_missed``."""

    due: list[Tick] = field(default_factory=list)
    missed: list[Tick] = field(default_factory=list)
    older_missed: dict[str, Span] = field(default_factory=dict)
    wake_at: datetime | None = None


@dataclass(slots=True)
class _Entry:
    trigger: Trigger
    start_at: datetime | None
    stop_at: datetime | None
    next_due: datetime | None
    generation: int
    chain: Chain | None = None


class Planner:
    """Each job's next tick, in a heap ordered by time.

    Removing or updating a job bumps its generation; stale heap entries are dropped when they
    surface, so every operation is O(log n).
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[datetime, int, str, int]] = []
        self._seq = itertools.count()
        # Ticks of the next instant, worked out ahead by prepare(): job -> tick. Built then,
        # while idle, rather than when they are due and every microsecond delays a run; the
        # collector tracks them meanwhile (one per job, until the instant).
        self._prepared: dict[str, Tick] = {}
        self._prepared_at: datetime | None = None
        self._chains: dict[str, _Entry] = {}  # the fixed-delay jobs

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job: str) -> bool:
        return job in self._entries

    def add(
        self,
        job: str,
        trigger: Trigger,
        now: datetime,
        *,
        start_at: datetime | None = None,
        stop_at: datetime | None = None,
        after: datetime | None = None,
    ) -> datetime | None:
        """Plan ``job`` from its first tick strictly after ``now`` (or after ``after``, for
        catch-up), not before ``start_at`` and before ``stop_at``. Replaces an earlier plan."""
        old = self._entries.get(job)
        self._prepared.pop(job, None)
        generation = 0 if old is None else old.generation + 1
        entry = _Entry(trigger, start_at, stop_at, None, generation)
        self._entries[job] = entry
        self._chains.pop(job, None)
        entry.chain = chain_of(trigger, now)
        if entry.chain is not None:
            self._chains[job] = entry
        origin = now if after is None else after
        if start_at is not None and start_at - _EPSILON > origin:
            origin = start_at - _EPSILON
        first = entry.trigger.next_after(origin)
        if entry.chain is not None:  # planned once the ledger is read at its instant
            entry.next_due = self._bounded(entry, first)
            entry.chain.holding = True
        else:
            self._set_next(job, entry, first)
        return entry.next_due

    def remove(self, job: str) -> bool:
        self._prepared.pop(job, None)
        self._chains.pop(job, None)
        return self._entries.pop(job, None) is not None

    def next_due(self, job: str) -> datetime | None:
        entry = self._entries.get(job)
        if entry is None:
            return None
        prepared = self._prepared.get(job)
        return entry.next_due if prepared is None else prepared.scheduled_at

    def upcoming(self, job: str, count: int) -> list[datetime]:
        """The job's next ``count`` planned ticks (within its start/stop window)."""
        entry = self._entries.get(job)
        found: list[datetime] = []
        if entry is None:
            return found
        prepared = self._prepared.get(job)
        if prepared is not None:
            found.append(prepared.scheduled_at)
        if entry.chain is not None:  # the ticks after it follow finishes still to come
            return [entry.next_due] if entry.next_due is not None and count > 0 else []
        current = entry.next_due
        while current is not None and len(found) < count:
            found.append(current)
            current = self._bounded(entry, entry.trigger.next_after(current))
        return found[:count]

    def wake_at(self) -> datetime | None:
        self._drop_stale()
        top = self._heap[0][0] if self._heap else None
        if self._prepared and self._prepared_at is not None:
            return self._prepared_at if top is None else min(top, self._prepared_at)
        return top

    def prepare(self) -> int:
        """Work out the next instant's ticks ahead of time, while the scheduler would sleep.

        Pops the jobs due at the earliest planned instant and plans their following ticks, so
        that :meth:`decide` at that instant has nothing left to compute. Returns how many
        ticks were prepared. Adding or removing a job drops its prepared tick.
        """
        heap, entries = self._heap, self._entries
        self._drop_stale()
        if not heap or (self._prepared and heap[0][0] != self._prepared_at):
            return 0
        at = heap[0][0]  # jobs added since the last call join the prepared ones
        before = len(self._prepared)
        chained: list[tuple[datetime, int, str, int]] = []
        while heap and heap[0][0] == at:
            item = heapq.heappop(heap)
            job = item[2]
            entry = entries[job]
            if entry.chain is not None:  # decided at its instant, after a read of the ledger
                chained.append(item)
            else:
                self._prepared[job] = Tick(job, at)
                self._set_next(job, entry, self._bounded(entry, entry.trigger.next_after(at)))
            self._drop_stale()
        for item in chained:
            heapq.heappush(heap, item)
        if not self._prepared:  # only fixed-delay jobs at that instant
            return 0
        self._prepared_at = at
        return len(self._prepared) - before

    def prepared(self) -> list[Tick]:
        """The ticks :meth:`prepare` worked out ahead, in the order :meth:`decide` gives them."""
        return list(self._prepared.values())

    def decide(self, now: datetime) -> Decision:
        """Pop every job due at ``now``; a job with several due ticks runs only the latest
        and the older ones are missed (coalesced)."""
        decision = Decision()
        heap, entries = self._heap, self._entries
        prepared: dict[str, Tick] = {}
        if self._prepared and self._prepared_at is not None and self._prepared_at <= now:
            prepared, self._prepared, self._prepared_at = self._prepared, {}, None
        popped: list[Tick] = []
        while True:
            self._drop_stale()
            if not heap or heap[0][0] > now:
                break
            job = heapq.heappop(heap)[2]
            entry = entries[job]
            assert entry.next_due is not None
            if entry.chain is not None:  # one tick at a time: the next follows its finish
                popped.append(Tick(job, entry.next_due))
                entry.chain.hand_out(entry.next_due)
                entry.next_due = None
                continue
            tick, following, missed, older = self._coalesce(entry, entry.next_due, now)
            earlier = prepared.pop(job, None)
            if earlier is not None:  # a later tick is due too: the prepared one is coalesced
                if older is None:
                    missed.insert(0, earlier.scheduled_at)
                else:
                    older = Span(earlier.scheduled_at, older.last, older.ticks + 1)
            if missed:
                decision.missed.extend(Tick(job, t) for t in missed)
            if older is not None:
                decision.older_missed[job] = older
            if tick is not None:
                popped.append(Tick(job, tick))
                self._set_next(job, entry, following)
            else:
                self._set_next(job, entry, self._bounded(entry, entry.trigger.next_after(now)))
        # Prepared ticks left the heap first, so they go first among equal instants.
        due = decision.due
        due.extend(prepared.values())
        if popped:
            due.extend(popped)
            if len(due) > 1:
                due.sort(key=_tick_time)
        decision.wake_at = heap[0][0] if heap else None
        return decision

    # ---- fixed-delay jobs: the next tick follows the last finish in the ledger -------------

    def chains_to_read(self, now: datetime) -> list[str]:
        """The fixed-delay jobs whose last finish is to be read from the ledger at ``now``
        (in one statement)."""
        return [
            job
            for job, entry in self._chains.items()
            if entry.chain is not None and entry.chain.wants_read(now, entry.next_due)
        ]

    def chain_read_at(self) -> datetime | None:
        """When the ledger is to be read next for a fixed-delay job."""
        times = [e.chain.read_at for e in self._chains.values() if e.chain and e.chain.read_at]
        return min(times, default=None)

    def learn(self, job: str, last: LastFinish | None, now: datetime) -> None:
        """The ledger's latest row of fixed-delay ``job`` (``None``: it has none), read at
        ``now`` (the clock's, not ahead of it): plan its next tick from the row's end, or
        none while it is open, or its first tick once read at its instant with no row."""
        entry = self._entries.get(job)
        if entry is None or entry.chain is None:
            return
        held = entry.chain.holding  # its first tick is not in the heap yet
        tick = entry.chain.learn(last, now, entry.next_due, entry.start_at)
        if tick is None:
            entry.next_due = None  # its heap entry is dropped as stale when it surfaces
        elif tick is not KEEP and (held or tick != entry.next_due):
            assert isinstance(tick, datetime)
            self._set_next(job, entry, tick)

    def left_to_leader(self, job: str) -> bool:
        """The tick of fixed-delay ``job`` just handed out is the leader's: not claimed here.
        Whether the job's chain takes it up again (see :meth:`retake`)."""
        entry = self._entries.get(job)
        if entry is not None and entry.chain is not None and entry.next_due is None:
            entry.chain.left = True
            return True
        return False

    def retake(self, job: str, now: datetime) -> None:
        """This replica now leads: a tick of fixed-delay ``job`` it left to the old leader
        is planned again, from the ledger (no row: that tick, late), or the chain stalls."""
        entry = self._entries.get(job)
        if entry is None or entry.chain is None or entry.next_due is not None:
            return
        tick = entry.chain.retake(now)
        if tick is not None:
            self._set_next(job, entry, tick)

    def finished_here(self, job: str, now: datetime) -> None:
        """A run of fixed-delay ``job`` ended here and its outcome is written: read its
        finish at once rather than at the next read."""
        entry = self._entries.get(job)
        if entry is not None and entry.chain is not None and entry.next_due is None:
            entry.chain.read_at = now

    def _coalesce(
        self, entry: _Entry, first: datetime, now: datetime
    ) -> tuple[datetime | None, datetime | None, list[datetime], Span | None]:
        """(tick to run, the tick after it, the latest older ticks missed, the span of those
        missed before them)."""
        following = self._bounded(entry, entry.trigger.next_after(first))
        if following is None or following > now:  # the usual case: not behind
            return first, following, [], None
        until = now if entry.stop_at is None else min(now, entry.stop_at - _EPSILON)
        walked = walk(entry.trigger, first, until)
        *missed, tick = walked.listed
        return tick, self._bounded(entry, walked.after), missed, walked.older

    def _bounded(self, entry: _Entry, tick: datetime | None) -> datetime | None:
        if tick is None or (entry.stop_at is not None and tick >= entry.stop_at):
            return None
        return tick

    def _set_next(self, job: str, entry: _Entry, tick: datetime | None) -> None:
        entry.next_due = self._bounded(entry, tick)
        if entry.next_due is not None:
            heapq.heappush(self._heap, (entry.next_due, next(self._seq), job, entry.generation))

    def _drop_stale(self) -> None:
        heap, entries = self._heap, self._entries
        while heap:
            due, _, job, generation = heap[0]
            entry = entries.get(job)
            if entry is not None and entry.generation == generation and entry.next_due == due:
                return
            heapq.heappop(heap)


def catch_up_plan(
    trigger: Trigger,
    last_tick: datetime,
    now: datetime,
    policy: CatchUp,
    grace: timedelta | None,
) -> tuple[list[datetime], list[datetime], Span | None]:
    """Ticks that fell due in ``(last_tick, now]`` while no replica was up.

    Returns (ticks to run now, ticks to record as missed, the span of older ticks to record
    as missed in one record). Only the latest :data:`MAX_ENUMERATED_TICKS` are listed; the
    policy decides among them: ``latest`` runs the most recent one if it is at most ``grace``
    old (``None``: any age), ``all`` runs every listed one, ``none`` runs none.
    """
    walked = walk(trigger, trigger.next_after(last_tick), now)
    ticks, older = walked.listed, walked.older
    if not ticks or policy == "none":
        return [], ticks, older
    if policy == "all":
        return ticks, [], older
    if grace is not None and now - ticks[-1] > grace:
        return [], ticks, older
    return ticks[-1:], ticks[:-1], older


def resync_plan(
    trigger: Trigger,
    first: datetime,
    last: datetime,
    now: datetime,
    policy: CatchUp,
    grace: timedelta | None,
    superseded: bool,
) -> tuple[list[datetime], list[datetime], Span | None]:
    """Ticks from ``first`` to ``last`` whose handling failed (the backend was unreachable),
    handled like ticks missed while no replica was up: returns (ticks to run now, ticks to
    record as missed, the span of older ticks to record as missed in one record).
    ``superseded``: a later tick of the job is due now, so none of these runs (it coalesces
    them)."""
    walked = walk(trigger, first, last)
    ticks, older = walked.listed, walked.older
    if not ticks or superseded or policy == "none":
        return [], ticks, older
    if policy == "all":
        return ticks, [], older
    latest = ticks[-1]
    if grace is not None and now - latest > grace:
        return [], ticks, older
    return [latest], ticks[:-1], older


def ticks_from(trigger: Trigger, first: datetime, last: datetime) -> list[datetime]:
    """The trigger's ticks from ``first`` (one of them) to ``last``, both included; at most
    the latest :data:`MAX_ENUMERATED_TICKS` (:func:`walk` tells the older ones too)."""
    return walk(trigger, first, last).listed


def walk(trigger: Trigger, first: datetime | None, until: datetime) -> Walk:
    """The trigger's ticks from ``first`` (one of them, or ``None``) to ``until``, both
    included: the latest :data:`MAX_ENUMERATED_TICKS` listed, the older ones counted into one
    span. The count is exact: a plain interval's older ticks are counted by arithmetic,
    other triggers' one by one (about 20 µs a tick)."""
    listed: deque[datetime] = deque(maxlen=MAX_ENUMERATED_TICKS)
    older_first: datetime | None = None
    older_last: datetime | None = None
    older = 0
    current = first
    step = _regular_step(trigger)
    if step is not None and current is not None and current <= until:
        skipped = (until - current) // step + 1 - MAX_ENUMERATED_TICKS
        if skipped > 0:
            older_first, older_last = current, current + (skipped - 1) * step
            older, current = skipped, current + skipped * step
    while current is not None and current <= until:
        if len(listed) == MAX_ENUMERATED_TICKS:
            older_last = listed[0]  # appending drops it from the listed ones
            if older_first is None:
                older_first = older_last
            older += 1
        listed.append(current)
        current = trigger.next_after(current)
    span = None
    if older_first is not None and older_last is not None:
        span = Span(older_first, older_last, older)
    return Walk(list(listed), span, current)


def _regular_step(trigger: Trigger) -> timedelta | None:
    """The spacing of ``trigger``'s ticks where every one is the last plus it (an interval
    without jitter or random gaps), else ``None``."""
    if isinstance(trigger, IntervalTrigger) and trigger.jitter is None:
        interval = trigger.interval
        if trigger.between is None and isinstance(interval, timedelta):
            return interval
    return None


Action = Literal["run", "skip", "queue"]


def overlap_action(policy: OverlapPolicy, running_here: int) -> Action:
    """What to do with a tick of a job that has ``running_here`` runs in this process."""
    if running_here == 0 or policy == "allow":
        return "run"
    return "skip" if policy == "skip" else "queue"
