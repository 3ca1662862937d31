"""The cluster as its shared ledger sees it: every job's last run and success, what runs now,
which expected tick never got a row (overdue), paused jobs, replicas that disagree on a job's
definition (drift), and the replicas themselves; and what of it is a problem (:class:`Problem`).

Backends shared by replicas (PostgreSQL, embedded) keep, besides the run ledger, a registry
of the jobs each replica schedules: the trigger's text, a fingerprint of the definition, the
grace after which a tick without a row is overdue, and the next tick the replica expects.
Anyone who reads the database can then tell a job that silently stopped running, even when
no replica is up to notice. :func:`build_status` turns what a backend read into the view that
``replicron status``, the status page and the metrics show; it is pure. What is wrong with a
job is decided in one place, :meth:`ClusterStatus.job_problems`: ``replicron status`` and
``--check``, the status page and :meth:`ClusterStatus.problems` render its :class:`Problem`
values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from ._problems import JobState, Problem, ProblemKind, Severity, how_long
from .dsn import mask_secrets
from .events import Outcome

__all__ = [
    "DEFAULT_OVERDUE_GRACE",
    "MOST_EXPECTED",
    "ClusterStatus",
    "JobDefinition",
    "JobState",
    "JobStatus",
    "JobView",
    "Pause",
    "Problem",
    "ProblemKind",
    "Registration",
    "ReplicaStatus",
    "Severity",
    "StatusSource",
    "build_status",
]

#: How long after an expected tick a job without a row for it is overdue, for a job without
#: ``misfire_grace`` (with it, the grace is the job's own).
DEFAULT_OVERDUE_GRACE = timedelta(minutes=1)
#: Expected ticks a replica writes per job at most (see :class:`JobDefinition`).
MOST_EXPECTED = 100
#: How old the last failure of a job nobody registers may be to still count as a problem.
_HISTORY = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class JobDefinition:
    """What a replica announces of a job it schedules."""

    job: str
    #: The trigger as written, e.g. ``cron('*/5 * * * *', tz='Europe/Kyiv')``.
    trigger: str
    #: A digest of everything that shapes the job's ticks and runs: trigger, options, the
    #: function's qualified name. Replicas that disagree on it drift.
    fingerprint: str
    #: A tick without a row this long after it makes the job overdue.
    grace: timedelta
    #: The next ticks this replica expects, ascending: at least the next two (if the job has
    #: them), and every one within a couple of minutes, at most ``MOST_EXPECTED``. Beyond a
    #: list that long, a reader extrapolates by the spacing of its last two.
    expected: tuple[datetime, ...]


@dataclass(frozen=True, slots=True)
class Registration:
    """A row of the cluster's job registry: one job as one replica schedules it."""

    job: str
    replica_id: str
    trigger: str
    fingerprint: str
    grace: timedelta
    expected: tuple[datetime, ...]
    #: When the replica last wrote the row.
    last_seen: datetime
    #: Whether the replica is alive now (heartbeating, or its process running).
    alive: bool


@dataclass(frozen=True, slots=True)
class Pause:
    """A job paused across the cluster: its ticks are recorded ``paused``, none runs."""

    job: str
    paused_at: datetime
    paused_by: str


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job's runs as the ledger has them."""

    job: str
    last_replica: str | None
    last_scheduled_at: datetime | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_outcome: str | None
    last_error: str | None
    last_success_at: datetime | None
    running: tuple[tuple[str, int], ...]  # (replica id, run id) of runs going on now
    #: Ticks recorded missed in the last day.
    missed: int
    #: Open runs whose heartbeat is stale: their replica is frozen or cut off. While its server
    #: session still holds the job's lock, the job is blocked.
    stale_running: tuple[tuple[str, int], ...] = ()
    #: The latest tick with a row, whatever its outcome, finished or not (manual runs are
    #: not ticks).
    last_tick: datetime | None = None


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    replica_id: str
    #: The replica's server session (PostgreSQL) or process (embedded).
    backend_pid: int | None
    #: How far the replica's clock is behind the coordinator's, in seconds (negative: ahead;
    #: ``None`` where replicas share one clock, or before it is measured).
    clock_offset: float | None
    started_at: datetime
    last_seen: datetime
    alive: bool
    #: The jobs the replica schedules (from the registry).
    jobs: tuple[str, ...] = ()
    #: What ``backend_pid`` is the id of, for a person: the replica's process, or its
    #: PostgreSQL server session.
    pid_label: str = "process id"


@dataclass(frozen=True, slots=True)
class JobView:
    """Everything an operator asks about one job."""

    job: str
    #: The trigger as the live replicas (else the latest) registered it.
    trigger: str | None
    last_scheduled_at: datetime | None
    last_outcome: str | None
    last_replica: str | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_error: str | None
    last_success_at: datetime | None
    running: tuple[tuple[str, int], ...]
    #: Open runs of frozen or cut-off replicas that may still hold the job's lock.
    blocked_by: tuple[tuple[str, int], ...]
    #: The next tick the live replicas (with none alive, the last ones) expect.
    next_due: datetime | None
    #: The expected tick that has no row though its grace has passed (``None``: not overdue).
    overdue_since: datetime | None
    paused: Pause | None
    #: The live replicas' registrations, when they disagree on the definition (else empty).
    drift: tuple[Registration, ...]
    missed: int
    #: Live replicas that schedule the job.
    scheduled_by: tuple[str, ...]
    #: Whether any replica, live or gone, has the job in the registry. A job dropped from the
    #: code (and forgotten) is history: a failure of its older than a day is no problem.
    registered: bool = True

    @property
    def overdue(self) -> bool:
        return self.overdue_since is not None

    @property
    def outcome(self) -> Outcome | None:
        """``last_outcome`` as an :class:`Outcome`: ``None`` while the last tick's run goes
        on (or for an outcome this version does not know)."""
        if self.last_outcome is None:
            return None
        try:
            return Outcome(self.last_outcome)
        except ValueError:
            return None

    @property
    def last_duration(self) -> timedelta | None:
        if self.last_started_at is None or self.last_finished_at is None:
            return None
        return self.last_finished_at - self.last_started_at


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    namespace: str
    #: When it was read, by the coordinator's clock.
    read_at: datetime
    jobs: tuple[JobView, ...]
    replicas: tuple[ReplicaStatus, ...]
    registrations: tuple[Registration, ...] = field(default=(), repr=False)
    #: Leader mode: the replica holding the leader lease, if any (and its lease is current).
    leader: str | None = None

    @property
    def live_replicas(self) -> tuple[ReplicaStatus, ...]:
        return tuple(r for r in self.replicas if r.alive)

    @property
    def departed_replicas(self) -> tuple[ReplicaStatus, ...]:
        """Replicas that stopped or died, the latest seen first: history (a replica id
        per process, by default), kept until the backend's ``retention`` prunes it."""
        gone = (r for r in self.replicas if not r.alive)
        return tuple(sorted(gone, key=lambda r: r.last_seen, reverse=True))

    def job(self, name: str) -> JobView | None:
        return next((view for view in self.jobs if view.job == name), None)

    def problems(self) -> list[str]:
        """One line per thing to act on (:meth:`job_problems`, of every job)."""
        return [problem.line for view in self.jobs for problem in self.job_problems(view)]

    def job_problems(self, view: JobView) -> tuple[Problem, ...]:
        """What is wrong with ``view``'s job, in this order: an expected tick without a row
        (overdue), live replicas that disagree on its definition, a last run that failed,
        timed out or was cut off (of a job no replica registers, only within a day of it),
        and one problem per run of a frozen replica that may hold its lock. A paused job is
        no problem by itself. The one answer ``replicron status``, its ``--check``, the
        status page and :meth:`problems` render."""
        name = view.job
        found: list[Problem] = []
        if view.overdue_since is not None:
            late = how_long(self.read_at - view.overdue_since)
            hint = ""
            if self.unscheduled(view):
                hint = (
                    " (no live replica schedules it: if it was dropped on purpose, "
                    f"`replicron forget {name}`)"
                )
            found.append(
                Problem(
                    name,
                    ProblemKind.OVERDUE,
                    f"overdue: the tick due at {_iso(view.overdue_since)} has no run {late} "
                    f"after it{hint}",
                )
            )
        if view.drift:
            shapes = "; ".join(f"{r.replica_id}: {r.trigger}" for r in view.drift)
            found.append(
                Problem(name, ProblemKind.DRIFT, f"definition drift between replicas ({shapes})")
            )
        outcome = view.outcome
        if (
            outcome is not None
            and outcome.is_failure
            and (view.registered or self._recent(view.last_finished_at or view.last_scheduled_at))
        ):
            error = f": {view.last_error}" if view.last_error else ""
            text = f"last run {outcome.value} (tick {_iso(view.last_scheduled_at)}){error}"
            found.append(Problem(name, ProblemKind.LAST_RUN_FAILED, text))
        for replica, run_id in view.blocked_by:
            found.append(
                Problem(
                    name,
                    ProblemKind.BLOCKED,
                    f"run {run_id} of replica {replica} stopped heartbeating while its session "
                    "may hold the job's lock: the job is blocked",
                )
            )
        return tuple(found)

    def job_states(
        self, view: JobView, problems: Sequence[Problem] | None = None
    ) -> tuple[JobState, ...]:
        """``view``'s job in words: its problems (``problems``, else :meth:`job_problems`),
        errors first, then whether it runs now, is paused, unscheduled or unregistered; ``ok``
        or ``no runs yet`` when none of these applies. The one answer that ``replicron
        status``, the status page and the Django admin show."""
        found = self.job_problems(view) if problems is None else problems
        states: list[JobState] = []
        for problem in found:
            if problem.kind is ProblemKind.LAST_RUN_FAILED:
                state = _FAILURE_STATE.get(view.outcome or Outcome.FAILED, JobState.FAILED)
            else:
                state = _PROBLEM_STATE[problem.kind]
            if state not in states:
                states.append(state)
        states.sort(key=lambda state: state.severity is not Severity.ERROR)
        if view.running:
            states.append(JobState.RUNNING)
        if view.paused is not None:
            states.append(JobState.PAUSED)
        if not view.registered:
            states.append(JobState.UNREGISTERED)
        elif self.unscheduled(view):
            states.append(JobState.UNSCHEDULED)
        if not states:
            quiet = view.last_outcome is None and view.last_scheduled_at is None
            states.append(JobState.NO_RUNS_YET if quiet else JobState.OK)
        return tuple(states)

    def unscheduled(self, view: JobView) -> bool:
        """No live replica schedules ``view``'s job while some replica is alive: dropped
        from the code, or its replicas are gone and others are not."""
        return not view.scheduled_by and any(r.alive for r in self.replicas)

    def _recent(self, instant: datetime | None) -> bool:
        return instant is not None and self.read_at - instant < _HISTORY

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values: instants as ISO-8601 UTC strings, durations in seconds."""
        return {
            "namespace": self.namespace,
            "read_at": _iso(self.read_at),
            "jobs": [
                {**_job_json(view), "states": list(self.job_states(view))} for view in self.jobs
            ],
            "replicas": [
                {
                    "replica_id": r.replica_id,
                    "alive": r.alive,
                    "pid": r.backend_pid,
                    "clock_offset_seconds": r.clock_offset,
                    "started_at": _iso(r.started_at),
                    "last_seen": _iso(r.last_seen),
                    "jobs": list(r.jobs),
                }
                for r in self.replicas
            ],
            "leader": self.leader,
            "problems": self.problems(),
        }


_PROBLEM_STATE = {
    ProblemKind.OVERDUE: JobState.OVERDUE,
    ProblemKind.DRIFT: JobState.DRIFT,
    ProblemKind.BLOCKED: JobState.BLOCKED,
}
_FAILURE_STATE = {
    Outcome.FAILED: JobState.FAILED,
    Outcome.TIMED_OUT: JobState.TIMED_OUT,
    Outcome.ABANDONED: JobState.ABANDONED,
}


@runtime_checkable
class StatusSource(Protocol):
    """Anything that reads the cluster's status: a shared backend, or a scheduler."""

    async def cluster_status(self) -> ClusterStatus: ...


def build_status(
    namespace: str,
    now: datetime,
    ledger: Sequence[JobStatus],
    registrations: Sequence[Registration],
    pauses: Sequence[Pause],
    replicas: Sequence[ReplicaStatus],
) -> ClusterStatus:
    """The cluster's view from what a backend read at ``now`` (the coordinator's clock).

    A job is overdue when some replica expected a tick of it (its registration's
    ``expected``), the tick's grace has passed, and the ledger has no row at or after that
    tick: nobody ran it, skipped it, paused it or recorded it missed. Registrations of replicas that
    are gone still count: a job whose replicas all stopped goes overdue at its next tick.
    When some live replica schedules the job, only the live replicas' expectations count.
    A paused job is never overdue. A job dropped from the code stays overdue until it is
    forgotten (``replicron forget``): that a job stopped on purpose is for a person to say.
    """
    runs = {status.job: status for status in ledger}
    paused = {pause.job: pause for pause in pauses}
    by_job: dict[str, list[Registration]] = {}
    for registration in registrations:
        by_job.setdefault(registration.job, []).append(registration)
    views = []
    for name in sorted(set(runs) | set(by_job) | set(paused)):
        status = runs.get(name)
        regs = by_job.get(name, [])
        live = [r for r in regs if r.alive]
        # The live replicas' expectations are fresh; those of replicas that are gone stand
        # only when no live replica schedules the job (every replica down, or the job's).
        expecting = live or regs
        views.append(
            JobView(
                job=name,
                trigger=_trigger_of(live or regs),
                last_scheduled_at=status.last_scheduled_at if status else None,
                last_outcome=status.last_outcome if status else None,
                last_replica=status.last_replica if status else None,
                last_started_at=status.last_started_at if status else None,
                last_finished_at=status.last_finished_at if status else None,
                # A job's error may quote a connection string: never shown with its password.
                last_error=mask_secrets(status.last_error)
                if status and status.last_error
                else None,
                last_success_at=status.last_success_at if status else None,
                running=status.running if status else (),
                blocked_by=status.stale_running if status else (),
                next_due=_next_due(expecting, status.last_tick if status else None),
                overdue_since=None
                if name in paused
                else _overdue_since(expecting, status.last_tick if status else None, now),
                paused=paused.get(name),
                drift=tuple(live) if len({r.fingerprint for r in live}) > 1 else (),
                missed=status.missed if status else 0,
                scheduled_by=tuple(sorted(r.replica_id for r in live)),
                registered=bool(regs),
            )
        )
    jobs_of: dict[str, list[str]] = {}
    for registration in registrations:
        jobs_of.setdefault(registration.replica_id, []).append(registration.job)
    with_jobs = tuple(
        dataclasses.replace(r, jobs=tuple(sorted(jobs_of.get(r.replica_id, ())))) for r in replicas
    )
    return ClusterStatus(namespace, now, tuple(views), with_jobs, tuple(registrations))


def _trigger_of(registrations: Sequence[Registration]) -> str | None:
    if not registrations:
        return None
    return max(registrations, key=lambda r: r.last_seen).trigger


def _expected_after(registration: Registration, last_tick: datetime | None) -> datetime | None:
    """The first tick ``registration`` expects after ``last_tick`` (the job's latest row):
    from its list, or past the list's end by the spacing of its last two ticks."""
    expected = registration.expected
    if not expected:
        return None
    if last_tick is None:
        return expected[0]
    following = next((tick for tick in expected if tick > last_tick), None)
    if following is not None or len(expected) < MOST_EXPECTED:
        # A list short of the most covers the horizon: nothing past it can be guessed (an
        # uneven cron, a jittered interval, the last of max_runs).
        return following
    step = expected[-1] - expected[-2]
    if step <= timedelta(0):
        return None
    return expected[-1] + step * ((last_tick - expected[-1]) // step + 1)


def _next_due(live: Sequence[Registration], last_tick: datetime | None) -> datetime | None:
    upcoming = [tick for r in live if (tick := _expected_after(r, last_tick)) is not None]
    return min(upcoming) if upcoming else None


def _overdue_since(
    registrations: Sequence[Registration], last_tick: datetime | None, now: datetime
) -> datetime | None:
    """The earliest expected tick with no row at or after it whose grace has passed."""
    late = [
        tick
        for r in registrations
        if (tick := _expected_after(r, last_tick)) is not None and tick + r.grace < now
    ]
    return min(late) if late else None


def _iso(instant: datetime | None) -> str | None:
    if instant is None:
        return None
    return instant.astimezone(UTC).isoformat(timespec="seconds")


def _job_json(view: JobView) -> dict[str, Any]:
    duration = view.last_duration
    return {
        "job": view.job,
        "trigger": view.trigger,
        "last_scheduled_at": _iso(view.last_scheduled_at),
        "last_outcome": view.last_outcome,
        "last_replica": view.last_replica,
        "last_started_at": _iso(view.last_started_at),
        "last_finished_at": _iso(view.last_finished_at),
        "last_duration_seconds": None if duration is None else duration.total_seconds(),
        "last_error": view.last_error,
        "last_success_at": _iso(view.last_success_at),
        "running": [{"replica_id": r, "run_id": run} for r, run in view.running],
        "blocked_by": [{"replica_id": r, "run_id": run} for r, run in view.blocked_by],
        "next_due": _iso(view.next_due),
        "overdue": view.overdue,
        "overdue_since": _iso(view.overdue_since),
        "paused": None
        if view.paused is None
        else {"paused_at": _iso(view.paused.paused_at), "paused_by": view.paused.paused_by},
        "drift": [
            {"replica_id": r.replica_id, "trigger": r.trigger, "fingerprint": r.fingerprint}
            for r in view.drift
        ],
        "missed_24h": view.missed,
        "scheduled_by": list(view.scheduled_by),
        "registered": view.registered,
    }
