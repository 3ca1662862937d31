"""What replicas write about themselves beside the ledger rows: joining and leaving
(``replica_joined``, ``replica_stopped``, ``replicas_staying``, ``other_modes``), the jobs
they schedule (``announce``), runs asked for across the cluster (``run_requests``,
``request_run``), retention (``prune``, ``prune_registry``) and the server's identity."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .database import Database, Params, interval
from .server import ServerSession
from .tables import RAN, RegistrationRow, RunRequestRow

#: The engine may move a manual run's instant by this much off the job's ticks.
_ONE_MS = timedelta(milliseconds=1)

__all__ = [
    "announce",
    "other_modes",
    "prune",
    "prune_registry",
    "replica_joined",
    "replica_stopped",
    "replicas_staying",
    "request_run",
    "run_requests",
    "server_identity",
]


def _alive(db: Database, namespace: str, replica: str, p: Params) -> bool:
    seen = db.tables.replicas.get((namespace, replica))
    return (
        seen is not None
        and seen.stopped_at is None
        and seen.last_seen > db.now - (seen.stale_after or interval(p["stale_after"]))
    )


def other_modes(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:other_modes``."""
    namespace, replica, mode = str(p["namespace"]), str(p["replica"]), str(p["coordination"])
    found: set[tuple[str, str]] = set()
    for seen in db.tables.replicas.values():
        theirs = seen.coordination or "advisory"
        if (
            seen.namespace == namespace
            and seen.replica_id != replica
            and theirs != mode
            and _alive(db, namespace, seen.replica_id, p)
        ):
            found.add((seen.replica_id, theirs))
    for row in db.tables.rows_in(namespace):
        if row.outcome is not None or row.replica_id == replica:
            continue
        held = db.locks.is_held(row.backend_pid, row.lock_key)
        if mode == "lease" and row.lease_until is None and held:
            found.add((row.replica_id, "advisory"))  # its run holds its job's advisory lock
        if mode == "advisory" and row.lease_until is not None and row.lease_until > db.now:
            found.add((row.replica_id, "lease"))
    return sorted(found)


def replica_joined(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    seen = db.tables.replicas.get((str(p["namespace"]), str(p["replica"])))
    if seen is not None:
        seen.started_at = p["since"]
    return []


def replica_stopped(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    seen = db.tables.replicas.get((str(p["namespace"]), str(p["replica"])))
    if seen is not None:
        seen.stopped_at = seen.stopped_at or db.now
    return []


def replicas_staying(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    namespace, replica = str(p["namespace"]), str(p["replica"])
    return sorted(
        (seen.replica_id, seen.started_at)
        for seen in db.tables.replicas.values()
        if seen.namespace == namespace
        and seen.replica_id != replica
        and _alive(db, namespace, seen.replica_id, p)
    )


def _instants(literal: str) -> list[datetime]:
    """An array literal of instants, as ``_cluster.py:_array`` writes them."""
    inner = literal.strip()[1:-1]
    return [datetime.fromisoformat(item.strip('"')) for item in inner.split(",") if item]


def announce(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:announce``."""
    namespace, replica, now = str(p["namespace"]), str(p["replica"]), db.now
    columns = ("jobs", "triggers", "fingerprints", "graces", "expected")
    definitions = list(zip(*(p[column] for column in columns), strict=True))
    jobs, removed, complete = list(p["jobs"]), list(p["removed"]), bool(p["complete"])
    registry = db.tables.registrations
    mine = [(job, fingerprint) for job, _, fingerprint, _, _ in definitions]
    mine += [
        (r.job, r.fingerprint)
        for r in registry.values()
        if r.namespace == namespace
        and r.replica_id == replica
        and not complete
        and r.job not in jobs
        and r.job not in removed
    ]
    drift = sorted(
        (
            (
                other.job,
                other.replica_id,
                other.trigger,
                other.fingerprint,
                other.grace,
                list(other.expected),
                other.last_seen,
            )
            for job, fingerprint in mine
            for other in registry.values()
            if other.namespace == namespace
            and other.job == job
            and other.replica_id != replica
            and other.fingerprint != fingerprint
            and _alive(db, namespace, other.replica_id, p)
        ),
        key=lambda row: (row[0], row[1]),
    )
    for key, r in list(registry.items()):
        if (
            r.namespace == namespace
            and r.replica_id == replica
            and (r.job in removed or (complete and r.job not in jobs))
        ):
            del registry[key]
    for job, trigger, fingerprint, grace, expected in definitions:
        registry[(namespace, job, replica)] = RegistrationRow(
            namespace, job, replica, trigger, fingerprint, grace, _instants(expected), now
        )
    return drift


def run_requests(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:run_requests``."""
    namespace, jobs, keep = str(p["namespace"]), list(p["jobs"]), interval(p["keep"])
    wanted = [
        r
        for r in db.tables.run_requests
        if r.namespace == namespace
        and r.job in jobs
        and r.requested_at > db.now - keep
        and not any(
            row.manual and r.requested_at <= row.scheduled_at <= r.requested_at + _ONE_MS
            for row in db.tables.rows_of(namespace, r.job)
        )
    ]
    return [
        (r.job, r.requested_at)
        for r in sorted(wanted, key=lambda r: (r.requested_at, r.request_id))
    ]


def request_run(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:request_run``."""
    namespace, job = str(p["namespace"]), str(p["job"])
    keep = interval(p["keep"])
    db.tables.run_requests = [
        r for r in db.tables.run_requests if not r.requested_at < db.now - keep
    ]
    if not any(r.namespace == namespace and r.job == job for r in db.tables.registrations.values()):
        return []
    db.tables.last_request_id += 1
    db.tables.run_requests.append(
        RunRequestRow(db.tables.last_request_id, namespace, job, db.now, str(p["by"]))
    )
    return [(db.now,)]


def prune(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:prune``. Which rows a batch takes is the server's choice: the model
    takes the oldest (the same rows whenever the batch holds every candidate)."""
    namespace = str(p["namespace"])
    retention, keep = interval(p["retention"]), interval(p["requests_keep"])
    latest: dict[str, int] = {}
    for row in db.tables.rows_in(namespace):
        if not row.manual:
            latest[row.job] = max(latest.get(row.job, 0), row.run_id)
    candidates = [
        row
        for row in db.tables.rows_in(namespace)
        if row.outcome is not None
        and row.claimed_at < db.now - retention
        and (not row.manual or row.claimed_at < db.now - keep)
        and row.run_id != latest.get(row.job)
    ][: int(p["batch"])]
    for row in candidates:
        db.tables.delete(row.run_id)
        if not row.manual and row.outcome in RAN:
            key = (namespace, row.job)
            db.tables.pruned_runs[key] = db.tables.pruned_runs.get(key, 0) + 1
    return [(len(candidates),)]


def prune_registry(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    namespace, retention = str(p["namespace"]), interval(p["retention"])
    registry = db.tables.registrations
    for key, r in list(registry.items()):
        if r.namespace == namespace and r.last_seen < db.now - retention:
            del registry[key]
    return []


def server_identity(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    return [db.identity]
