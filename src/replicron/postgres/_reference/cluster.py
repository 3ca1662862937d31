"""The namespace around the ledger rows: replicas as their heartbeats note them, the leader
lease, pauses, and the reads of the latest ticks and the clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .database import Database, Params, interval
from .server import ServerSession
from .tables import LeaderRow, ReplicaRow

__all__ = [
    "clock_sample",
    "database_clock",
    "last_finishes",
    "last_ticks",
    "lead",
    "leader_lease",
    "leader_now",
    "leader_resign",
    "pause",
    "resume",
    "seen",
]


def seen(db: Database, p: Params, pid: int | None, coordination: str) -> list[str]:
    """A heartbeat's ``seen`` upsert of the replica, and the peers its main query reads (from
    the statement's snapshot: before the upsert)."""
    namespace, replica, now = str(p["namespace"]), str(p["replica"]), db.now
    stale_after, leaving = interval(p["stale_after"]), bool(p["leaving"])
    peers = sorted(
        r.replica_id
        for r in db.tables.replicas.values()
        if r.namespace == namespace
        and r.stopped_at is None
        and r.last_seen > now - (r.stale_after or stale_after)
    )
    offset = p["offset_ms"]
    was = db.tables.replicas.get((namespace, replica))
    if was is None:
        db.tables.replicas[(namespace, replica)] = ReplicaRow(
            namespace,
            replica,
            pid,
            offset,
            now,
            now,
            None,
            stale_after,
            coordination,
        )
        return peers
    restarted = (was.stopped_at is not None and not leaving) or was.last_seen <= now - (
        was.stale_after or stale_after
    )
    was.backend_pid, was.clock_offset_ms = pid, offset
    was.coordination, was.last_seen, was.stale_after = coordination, now, stale_after
    was.stopped_at = (was.stopped_at or now) if leaving else None
    was.started_at = now if restarted else was.started_at
    return peers


def lead(db: Database, p: Params) -> tuple[str, int]:
    """``replicron_lead(namespace, replica, leader_lease)``."""
    namespace, holder, now = str(p["namespace"]), str(p["replica"]), db.now
    until = now + interval(p["leader_lease"])
    lease = db.tables.leaders.get(namespace)
    if lease is None:
        lease = db.tables.leaders[namespace] = LeaderRow(namespace, holder, 1, now, until)
    elif lease.holder == holder or lease.expires_at < now:
        if lease.holder != holder:
            lease.epoch += 1
            lease.acquired_at = now
        lease.holder, lease.expires_at = holder, until
    return lease.holder, lease.epoch


def leader_lease(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    return [lead(db, p)]


def leader_now(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    lease = db.tables.leaders.get(str(p["namespace"]))
    return [(lease.holder,)] if lease is not None and lease.expires_at > db.now else []


def leader_resign(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    lease = db.tables.leaders.get(str(p["namespace"]))
    if lease is not None and lease.holder == p["replica"]:
        lease.expires_at = db.now
    return []


def pause(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    key = (str(p["namespace"]), str(p["job"]))
    if key in db.tables.paused:
        return []
    db.tables.paused[key] = (db.now, str(p["by"]))
    return [(key[1],)]


def resume(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    key = (str(p["namespace"]), str(p["job"]))
    return [(key[1],)] if db.tables.paused.pop(key, None) is not None else []


def last_ticks(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    namespace = str(p["namespace"])
    latest = []
    for job in sorted(set(p["jobs"])):
        rows = [row for row in db.tables.rows_of(namespace, job) if not row.manual]
        if rows:
            ends = [row.scheduled_at for row in rows]
            ends += [row.scheduled_through for row in rows if row.scheduled_through is not None]
            latest.append((job, max(ends)))
            continue
        firsts = [
            r.expected[0]
            for r in db.tables.registrations.values()
            if r.namespace == namespace and r.job == job and r.expected
        ]
        if firsts:
            latest.append((job, min(firsts) - timedelta(microseconds=1)))
    return latest


def last_finishes(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    namespace = str(p["namespace"])
    latest = []
    for job in p["jobs"]:
        rows = [row for row in db.tables.rows_of(namespace, job) if not row.manual]
        if rows:
            last = max(rows, key=lambda row: row.scheduled_at)
            latest.append((job, last.scheduled_at, last.finished_at, last.outcome))
    return latest


def database_clock(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    return [(db.now,)]


def clock_sample(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    return [(session.pid, db.now)]
