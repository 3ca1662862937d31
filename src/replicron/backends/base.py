"""The seam between the engine and a coordination backend.

A backend answers three questions for the engine:

* **claim**: is this tick mine? Among replicas sharing a backend exactly one claim of a tick
  succeeds (a unique ``(job, scheduled_at)`` record, never a timing race). A claim may also
  ask for the job's run lock (no overlap); the lock is held until :meth:`Backend.release`.
  A claim may be a manual run (``run_now``, at an instant off the job's ticks), or carry the
  job's ``max_runs``, counted over the runs of every replica.
* **release**: the run (or non-run) ended with this outcome; record it and drop the lock.
* **last_ticks**: the latest tick of each job anybody recorded (for a registered job with
  none, the instant before the first tick its registrations expect), to find ticks missed
  while no replica was up.

Optional capabilities are small protocols of their own, checked with ``isinstance``:

* :class:`SharedCoordination`: replicas in other processes claim from the backend too. A
  scheduler then claims at an instant only the runs it can start promptly (``spreads_bursts``)
  and leaves the rest to its ``peers`` with free worker threads; where ``claims_ahead`` is
  set, a scheduler on the system clock claims an instant's ticks up to that much early, by its
  claims' recent round trips, and starts the runs on time. ``connected`` is for readiness.
* :class:`RunRequests`: manual runs asked for across the cluster (``replicron run-now``),
  which every replica that schedules the job polls for and claims as a manual run at the
  requested instant: the ledger's unique ``(job, scheduled_at)`` runs each once.
* :class:`LastFinishes`: the backend reads each job's latest recorded tick and how it ended,
  for fixed-delay jobs (``after(...)``), whose next tick follows the last finish.
* :class:`ClusterRegistry`: the backend keeps the cluster's job registry (what each replica
  schedules, for overdue jobs and drift), its pauses, and its status for operators;
  :class:`NamespacedRegistry` also lists the namespaces sharing its store.

Backends never import the engine. All methods are coroutines so that a networked backend can
await I/O; the engine batches the claims of ticks due at the same instant into one call, and
the releases that pile up while a call is under way into the next.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

from replicron.cluster import ClusterStatus, JobDefinition, Registration
from replicron.events import Outcome

__all__ = [
    "RUN_REQUEST_EXPIRY",
    "Backend",
    "Claim",
    "ClaimRequest",
    "ClaimStatus",
    "ClusterRegistry",
    "LastFinish",
    "LastFinishes",
    "LeasedRuns",
    "NamespacedRegistry",
    "Release",
    "RunRecord",
    "RunRequests",
    "ServerChanges",
    "SharedCoordination",
    "answer_each",
    "once_per_tick",
    "taken_repeat",
    "unrecorded_repeat",
]


class ClaimStatus(enum.Enum):
    #: The tick is ours (and the lock, if one was asked for): run it.
    CLAIMED = "claimed"
    #: Another replica claimed this tick: do nothing, it records the outcome.
    TAKEN = "taken"
    #: The tick is ours but the job's lock is held by a run elsewhere: we record
    #: ``skipped_overlap``.
    LOCKED = "locked"
    #: The tick is not yet due by the coordinator's clock (this replica's clock runs ahead of
    #: it): nothing was recorded; ask again when it is due.
    EARLY = "early"
    #: The job has started ``max_runs`` scheduled runs across every replica sharing the
    #: backend: its limited runs are over, it has no more ticks. Nothing was recorded.
    EXHAUSTED = "exhausted"
    #: The job is paused across the cluster: the tick is ours and was recorded ``paused``
    #: by the claim itself. Nothing runs.
    PAUSED = "paused"


# Named tuples, not dataclasses: the engine makes several of these per run, and a frozen
# dataclass costs several times as much to build.
class ClaimRequest(NamedTuple):
    job: str
    scheduled_at: datetime
    #: Take the job's run lock as well (overlap policy ``skip``/``queue``).
    lock: bool
    #: A manual run (``run_now``), not a tick of the job's trigger: recorded as manual, never
    #: refused as not yet due, not counted against ``max_runs``. The engine picks its instant
    #: off the job's ticks, so it never takes one.
    manual: bool = False
    #: The job's ``max_runs``: the claim is answered ``EXHAUSTED`` (and nothing recorded) once
    #: the job has started that many scheduled runs across every replica.
    max_runs: int | None = None


class Claim(NamedTuple):
    job: str
    scheduled_at: datetime
    status: ClaimStatus
    #: Fencing token: strictly increasing per job across all replicas (``None`` unless
    #: ``status`` is ``CLAIMED``).
    run_id: int | None
    locked: bool
    #: The request's ``manual``.
    manual: bool = False


class RunRecord(NamedTuple):
    job: str
    scheduled_at: datetime
    outcome: Outcome
    replica_id: str
    run_id: int | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    #: A manual run (``run_now``) rather than a tick of the job's trigger.
    manual: bool = False
    #: For ``record_unclaimed``: the job's ``max_runs``. Once the job has finished that many
    #: scheduled runs across every replica its later ticks are not ticks of the job, and
    #: nothing is recorded for them (answered ``False``). Not kept in a :data:`PackedRecord`.
    max_runs: int | None = None
    #: A range of missed ticks (see ``record_unclaimed``): the last of them; ``scheduled_at``
    #: is the first. ``None`` for a record of one tick.
    through: datetime | None = None
    #: How many ticks the record stands for: 1, or the ticks of its range.
    ticks: int = 1
    #: For a range: the first ticks of its span (``scheduled_at`` first), where its row may
    #: be keyed (see ``record_unclaimed``); empty means ``scheduled_at`` alone.
    starts: tuple[datetime, ...] = ()


class _OfATick(Protocol):
    @property
    def job(self) -> str: ...

    @property
    def scheduled_at(self) -> datetime: ...


_Item = TypeVar("_Item", bound=_OfATick)
_Answer = TypeVar("_Answer")


def once_per_tick(batch: Sequence[_Item]) -> tuple[list[_Item], list[int]]:
    """A batch with each ``(job, tick)`` once: the items that first mention each tick (in
    order), and for every item of ``batch`` the position of its tick among them, or -1 for a
    repeat. Ticks are told apart by instant, whatever their zone: two aware datetimes of one
    zone compare by wall time, so the two instants of a repeated local hour would be one. A
    backend handles each tick once and answers every item with :func:`answer_each`."""
    first: dict[tuple[str, datetime], int] = {}
    unique: list[_Item] = []
    where: list[int] = []
    for item in batch:
        at = item.scheduled_at
        if at.tzinfo is not UTC:
            at = at.astimezone(UTC)
        position = first.setdefault((item.job, at), len(unique))
        if position == len(unique):
            unique.append(item)
            where.append(position)
        else:
            where.append(-1)
    return unique, where


def answer_each(
    batch: Sequence[_Item],
    answers: Sequence[_Answer],
    where: Sequence[int],
    repeat: Callable[[_Item], _Answer],
) -> list[_Answer]:
    """The answers to the ticks :func:`once_per_tick` kept, one per item of ``batch``; a
    repeat of a tick earlier in the batch gets ``repeat(item)`` (it was handled once)."""
    return [answers[at] if at >= 0 else repeat(item) for item, at in zip(batch, where, strict=True)]


def taken_repeat(request: ClaimRequest) -> Claim:
    """The answer to a claim request repeating a tick earlier in its batch."""
    return Claim(request.job, request.scheduled_at, ClaimStatus.TAKEN, None, False, request.manual)


def unrecorded_repeat(record: RunRecord) -> int | None:
    """The answer to an unclaimed record repeating a tick earlier in its batch."""
    return False


#: A :class:`RunRecord` as a plain tuple of plain values, its outcome as the string. The
#: garbage collector stops tracking such a tuple at its first pass (it cannot for a named
#: tuple, or one holding an enum member), so the records kept for a while (each job's last
#: outcome, the memory backend's history) add nothing to its full passes.
PackedRecord = tuple[
    str, datetime, str, str, int | None, datetime | None, datetime | None, str | None, bool
]


def pack_record(record: RunRecord) -> PackedRecord:
    job, scheduled_at, outcome, replica_id, run_id, started, finished, error, manual = record[:9]
    return (job, scheduled_at, outcome.value, replica_id, run_id, started, finished, error, manual)


def unpack_record(packed: PackedRecord) -> RunRecord:
    job, scheduled_at, outcome, replica_id, run_id, started, finished, error, manual = packed
    return RunRecord(
        job, scheduled_at, Outcome(outcome), replica_id, run_id, started, finished, error, manual
    )


class Release(NamedTuple):
    record: RunRecord
    #: Drop the job's run lock (the claim took it).
    unlock: bool


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a coordination backend."""

    def register_job(self, name: str) -> None:
        """A job of this name was added; raise a ``ConfigurationError`` if the backend cannot
        keep it apart from the jobs already registered (lock-key collision)."""

    def unregister_job(self, name: str) -> None:
        """The job was removed."""

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        """Connect; called once when a scheduler starts. ``on_lock_lost`` is called (on the
        scheduler's loop) with the run ids whose locks were lost, e.g. with the session."""

    async def close(self) -> None:
        """Release every lock of this replica and disconnect; idempotent."""

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Try to claim each tick (one result per request, in order)."""

    async def lock(self, claim: Claim) -> bool:
        """Take the run lock for an already claimed tick (queued runs); False if held."""

    async def release(self, releases: Sequence[Release]) -> None:
        """Record how claimed ticks ended and, where ``unlock`` is set, drop their job's
        lock."""

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        """Record outcomes of ticks nobody ran (missed) unless another replica already
        recorded the tick; True where this call recorded it, None where the tick is not yet
        due by the coordinator's clock (nothing recorded: claim it when it is due).

        A record with ``through`` is a range: the missed ticks from ``scheduled_at`` through
        ``through``, ``ticks`` of them, in one row. Ticks of the span that already have rows
        of their own keep them: the row stands for the others, keyed by the first of
        ``starts`` with no row, and its answer is how many ticks it stands for (``ticks``
        less those rows). It is refused (False) if another range lies in its span (those
        ticks are somebody else's: two replicas writing one gap end with one range), or if
        every one of ``starts`` has a row. A tick inside a recorded range has its record:
        recording it again is refused. ``last_ticks`` counts a range by its last tick."""

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        """The latest tick of each job recorded by anybody, a range of missed ticks by its
        last (manual runs are not ticks). A job with no tick recorded that a replica
        registered (``announce``): the instant just before the first tick a registration of
        it expects, so that a catch-up finds that tick too (it fell due while every replica
        that scheduled the job was down). Jobs neither recorded nor registered are left out."""

    def clock_offset(self) -> timedelta | None:
        """How far the coordinator's clock is ahead of this process's (``None``: the
        coordinator has no clock of its own, or it is not measured yet). Schedulers on the
        system clock fire ticks on the coordinator's time."""


@runtime_checkable
class SharedCoordination(Protocol):
    """A backend that replicas in other processes claim from too (embedded, PostgreSQL)."""

    @property
    def spreads_bursts(self) -> bool:
        """Whether a scheduler should claim at an instant only what it can start promptly and
        leave the rest to replicas with free worker threads."""

    @property
    def peers(self) -> frozenset[str] | None:
        """The replicas sharing the backend as last seen, this one among them; ``None`` where
        the backend does not know (others may be there)."""

    @property
    def claims_ahead(self) -> timedelta | None:
        """How long before a tick is due a claim of it is accepted (``None``: not before)."""

    async def join(self, since: datetime) -> None:
        """This replica plans every tick after ``since`` (its scheduler's clock): a
        replica that leaves later hands it only ticks from then on."""

    async def leave(self) -> Mapping[str, datetime] | None:
        """This replica claims no more (it is stopping): it is gone for the other replicas
        at once. Returns the replicas that stay, read after that (of two replicas leaving at
        once, at least one sees the other gone), each with the ``since`` it joined with;
        ``None`` where the backend does not know. A tick a stopping replica left for others
        is theirs if one that stays was planning at its instant: the others did not plan it."""

    @property
    def connected(self) -> bool:
        """Whether the backend can coordinate now (its session is open): for readiness."""

    @property
    def refusal(self) -> str | None:
        """Why this replica claims nothing now though connected (PostgreSQL: replicas of the
        other coordination mode share its namespace), or ``None``: for readiness."""


class LastFinish(NamedTuple):
    """A job's latest tick in the ledger (manual runs left out) and how it ended."""

    scheduled_at: datetime
    #: When its row was ended, on the ledger's clock: the run's finish, or when a tick that
    #: did not run was recorded (missed, skipped, paused, abandoned). ``None`` while open.
    finished_at: datetime | None
    #: ``None`` while the tick is claimed and not yet ended (its run goes on).
    outcome: Outcome | None


@runtime_checkable
class LastFinishes(Protocol):
    """A backend that reads each job's latest tick and its end in one call."""

    async def last_finishes(self, jobs: Sequence[str]) -> dict[str, LastFinish]:
        """The latest tick of each job anybody claimed or recorded, and how it ended (jobs
        with none are left out; manual runs are not ticks). Times are in UTC."""


@runtime_checkable
class LeasedRuns(Protocol):
    """A backend whose locked runs hold their lock under a lease that may run out (the
    replica cut off, or frozen), after which another replica may take the job over."""

    def lease_end(self, run_id: int) -> float | None:
        """When the run's lease ends unless a heartbeat renews it, on ``time.monotonic()``'s
        clock (the same in every process of the host); ``None`` if the run holds none."""


@runtime_checkable
class ServerChanges(Protocol):
    """A backend that notices when its server changes under it (a failover to a promoted
    standby), and counts it."""

    @property
    def server_changes(self) -> int:
        """How many times the server changed under this replica."""


@runtime_checkable
class ClusterRegistry(Protocol):
    """A backend that keeps the cluster's job registry, pauses and status."""

    async def announce(
        self, definitions: Sequence[JobDefinition], removed: Sequence[str], complete: bool
    ) -> list[Registration]:
        """Write this replica's definitions of ``definitions`` (``complete``: they are all of
        its jobs), drop ``removed``; returns the other replicas' registrations of these jobs
        (for drift)."""

    async def cluster_status(self) -> ClusterStatus:
        """Every job's last run and success, what runs now, overdue, paused and drifting
        jobs, the replicas."""

    async def pause(self, job: str, by: str) -> bool:
        """Pause ``job`` on every replica; False if it was paused already."""

    async def resume(self, job: str) -> bool:
        """Resume ``job`` on every replica; False if it was not paused."""

    async def forget(self, job: str) -> tuple[list[str], list[str]]:
        """Drop ``job`` from the registry unless a live replica schedules it; returns the
        replicas whose registrations were dropped, and the live ones that kept it."""


@runtime_checkable
class NamespacedRegistry(ClusterRegistry, Protocol):
    """A cluster registry whose store several deployments share, each under a namespace."""

    async def namespaces(self) -> dict[str, int]:
        """Every namespace with recorded runs, and its number of rows."""


#: A manual run asked for across the cluster and not taken up by then (no replica of the job
#: was up) is run no more; the request is deleted at a later request.
RUN_REQUEST_EXPIRY = timedelta(minutes=10)


@runtime_checkable
class RunRequests(Protocol):
    """A backend that keeps manual runs asked for across the cluster."""

    async def request_run(self, job: str, by: str) -> datetime:
        """Ask for one manual run of ``job`` now, by whichever replica that schedules it sees
        the request first; returns the instant asked for (its run is recorded at it, or at
        most a millisecond later, off the job's ticks). Raises ``JobNotFoundError`` when no
        replica registered the job. A connection of its own: callable from anywhere."""

    async def run_requests(self, jobs: Sequence[str]) -> list[tuple[str, datetime]]:
        """The requests for ``jobs`` not yet run and younger than :data:`RUN_REQUEST_EXPIRY`,
        oldest first, as ``(job, requested instant)`` (a replica's poll, on its open
        backend)."""
