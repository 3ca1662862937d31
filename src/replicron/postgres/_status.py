"""What ``PostgresBackend.status()`` and ``replicas()`` return: the cluster as the ledger
sees it (the types live in :mod:`replicron.cluster`, shared with the other backends)."""

from __future__ import annotations

from typing import Any

from replicron.cluster import JobStatus, ReplicaStatus

__all__ = ["JobStatus", "ReplicaStatus", "job_status", "replica_status"]


def _pairs(items: list[str]) -> tuple[tuple[str, int], ...]:
    pairs = []
    for item in items:
        who, _, run_id = item.rpartition(" ")
        pairs.append((who, int(run_id)))
    return tuple(pairs)


def job_status(row: tuple[Any, ...]) -> JobStatus:
    (
        job,
        replica,
        scheduled,
        started,
        finished,
        outcome,
        error,
        success,
        running,
        missed,
        stale,
        last_tick,
    ) = row
    return JobStatus(
        job,
        replica,
        scheduled,
        started,
        finished,
        outcome,
        error,
        success,
        _pairs(running),
        int(missed),
        _pairs(stale),
        last_tick,
    )


def replica_status(row: tuple[Any, ...]) -> ReplicaStatus:
    replica, pid, offset_ms, started, seen, alive = row
    offset = None if offset_ms is None else offset_ms / 1000
    return ReplicaStatus(
        replica, pid, offset, started, seen, bool(alive), pid_label="PostgreSQL backend pid"
    )
