"""The reference ledger's tables: the rows of ``schema.sql`` as Python values, the unique
keys the SQL relies on, and the run id sequence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

__all__ = [
    "OUTCOMES",
    "RAN",
    "JobLockRow",
    "LeaderRow",
    "RegistrationRow",
    "ReplicaRow",
    "RunRequestRow",
    "RunRow",
    "StatementError",
    "Tables",
]

#: What ``replicron_runs.outcome`` admits (its CHECK constraint).
OUTCOMES = frozenset(
    {
        "succeeded",
        "failed",
        "timed_out",
        "skipped_overlap",
        "skipped_limit",
        "missed",
        "abandoned",
        "paused",
    }
)
#: The outcomes ``replicron_runs_reached`` counts as runs.
RAN = frozenset({"succeeded", "failed", "timed_out", "abandoned"})


class StatementError(Exception):
    """What the server answers a statement with instead of rows: its SQLSTATE and message.
    The statement's writes are undone; what the server does not undo (a sequence's values,
    a session's advisory locks) stays as it is."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate = sqlstate


def check_outcome(outcome: str | None) -> None:
    if outcome is not None and outcome not in OUTCOMES:
        raise StatementError(
            "23514",
            'new row for relation "replicron_runs" violates check constraint '
            '"replicron_runs_outcome_check"',
        )


@dataclass
class RunRow:
    """A row of ``replicron_runs``."""

    run_id: int
    namespace: str
    job: str
    scheduled_at: datetime
    replica_id: str
    claimed_at: datetime
    heartbeat_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: str | None = None
    error: str | None = None
    claim_token: UUID | None = None
    lock_key: int | None = None
    backend_pid: int | None = None
    manual: bool = False
    epoch: int = 0
    lease_until: datetime | None = None
    scheduled_through: datetime | None = None
    ticks: int = 1


@dataclass
class JobLockRow:
    """A row of ``replicron_job_locks``: a job's lock in lease mode."""

    namespace: str
    job: str
    run_id: int | None
    replica_id: str | None
    epoch: int
    lease_until: datetime | None


@dataclass
class LeaderRow:
    """A row of ``replicron_leaders``."""

    namespace: str
    holder: str
    epoch: int
    acquired_at: datetime
    expires_at: datetime


@dataclass
class ReplicaRow:
    """A row of ``replicron_replicas``."""

    namespace: str
    replica_id: str
    backend_pid: int | None
    clock_offset_ms: float | None
    started_at: datetime
    last_seen: datetime
    stopped_at: datetime | None
    stale_after: timedelta | None
    coordination: str | None


@dataclass
class RegistrationRow:
    """A row of ``replicron_jobs``: a job as one replica schedules it."""

    namespace: str
    job: str
    replica_id: str
    trigger: str
    fingerprint: str
    grace: timedelta
    expected: list[datetime]
    last_seen: datetime


@dataclass
class RunRequestRow:
    """A row of ``replicron_run_requests``."""

    request_id: int
    namespace: str
    job: str
    requested_at: datetime
    requested_by: str


@dataclass
class Tables:
    """Every table the coordination statements read or write, with the keys PostgreSQL
    enforces on them. A statement works on the tables in place and, where the SQL reads its
    statement's snapshot after writing, on what it read before its first write."""

    runs: dict[int, RunRow] = field(default_factory=dict)
    #: ``replicron_runs_tick_key``: (namespace, job, scheduled_at) -> run_id.
    ticks: dict[tuple[str, str, datetime], int] = field(default_factory=dict)
    #: run ids per (namespace, job), for the statements that look at a job's rows.
    by_job: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    job_locks: dict[tuple[str, str], JobLockRow] = field(default_factory=dict)
    leaders: dict[str, LeaderRow] = field(default_factory=dict)
    replicas: dict[tuple[str, str], ReplicaRow] = field(default_factory=dict)
    #: ``replicron_paused``: (namespace, job) -> (paused_at, paused_by).
    paused: dict[tuple[str, str], tuple[datetime, str]] = field(default_factory=dict)
    #: ``replicron_pruned_runs``: (namespace, job) -> runs.
    pruned_runs: dict[tuple[str, str], int] = field(default_factory=dict)
    registrations: dict[tuple[str, str, str], RegistrationRow] = field(default_factory=dict)
    run_requests: list[RunRequestRow] = field(default_factory=list)
    #: The last value ``replicron_runs_run_id_seq`` handed out.
    last_run_id: int = 0
    last_request_id: int = 0

    def next_run_id(self) -> int:
        """``nextval``: drawn for every row an insert tries, whether or not it lands."""
        self.last_run_id += 1
        return self.last_run_id

    def delete(self, run_id: int) -> None:
        row = self.runs.pop(run_id)
        del self.ticks[(row.namespace, row.job, row.scheduled_at)]
        self.by_job[(row.namespace, row.job)].discard(run_id)

    def row_at(self, namespace: str, job: str, tick: datetime) -> RunRow | None:
        run_id = self.ticks.get((namespace, job, tick))
        return None if run_id is None else self.runs[run_id]

    def rows_of(self, namespace: str, job: str) -> list[RunRow]:
        return [self.runs[run_id] for run_id in sorted(self.by_job.get((namespace, job), ()))]

    def rows_in(self, namespace: str) -> list[RunRow]:
        return [row for _, row in sorted(self.runs.items()) if row.namespace == namespace]

    def insert(self, row: RunRow) -> bool:
        """``INSERT ... ON CONFLICT (namespace, job, scheduled_at) DO NOTHING``."""
        key = (row.namespace, row.job, row.scheduled_at)
        if key in self.ticks:
            return False
        self.ticks[key] = row.run_id
        self.runs[row.run_id] = row
        self.by_job.setdefault((row.namespace, row.job), set()).add(row.run_id)
        return True

    def free_locks(
        self, namespace: str, run_ids: Iterable[int | None], replica: str | None = None
    ) -> list[JobLockRow]:
        """``UPDATE replicron_job_locks SET run_id = NULL, replica_id = NULL, lease_until =
        NULL`` where the lock names one of ``run_ids`` (and, if given, ``replica``): the
        lock rows freed, as they were named before."""
        runs = set(run_ids)
        freed = []
        for lock in self.job_locks.values():
            if (
                lock.namespace == namespace
                and lock.run_id in runs
                and (replica is None or lock.replica_id == replica)
            ):
                freed.append(JobLockRow(**vars(lock)))
                lock.run_id = lock.replica_id = lock.lease_until = None
        return freed

    def in_a_range(self, namespace: str, job: str, tick: datetime) -> bool:
        """Whether a range of missed ticks of the job holds ``tick`` after its first."""
        return any(
            row.scheduled_through is not None
            and row.scheduled_through >= tick
            and row.scheduled_at < tick
            for row in self.rows_of(namespace, job)
        )
