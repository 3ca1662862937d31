"""What ``PostgresBackend.status()`` and ``replicas()`` return: the cluster as the ledger
sees it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["JobStatus", "ReplicaStatus", "job_status", "replica_status"]


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: str
    last_replica: str | None
    last_scheduled_at: datetime | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_outcome: str | None
    last_error: str | None
    last_success_at: datetime | None
    running: tuple[tuple[str, int], ...]  # (replica id, run id) of runs going on now
    missed: int
    #: Open runs whose heartbeat is stale: their replica is frozen or cut off. While its server
    #: session still holds the job's lock, the job is blocked.
    stale_running: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    replica_id: str
    backend_pid: int | None
    #: How far the replica's clock is behind the database's, in seconds (negative: ahead).
    clock_offset: float | None
    started_at: datetime
    last_seen: datetime
    alive: bool


def _pairs(items: list[str]) -> tuple[tuple[str, int], ...]:
    pairs = []
    for item in items:
        who, _, run_id = item.rpartition(" ")
        pairs.append((who, int(run_id)))
    return tuple(pairs)


def job_status(row: tuple[Any, ...]) -> JobStatus:
    (job, replica, scheduled, started, finished, outcome, error, success, running, missed,
     stale) = row  # fmt: skip
    return JobStatus(
        job, replica, scheduled, started, finished, outcome, error, success, _pairs(running),
        int(missed), _pairs(stale),
    )  # fmt: skip


def replica_status(row: tuple[Any, ...]) -> ReplicaStatus:
    replica, pid, offset_ms, started, seen, alive = row
    offset = None if offset_ms is None else offset_ms / 1000
    return ReplicaStatus(replica, pid, offset, started, seen, bool(alive))
