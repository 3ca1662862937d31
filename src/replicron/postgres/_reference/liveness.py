"""Holding a tick while its run goes on, and giving up the holds of replicas that went:
the job lock of a queued run (``lock``, ``lease_lock``), heartbeats (``heartbeat``,
``lease_heartbeat``), the janitors (``abandon_stale``, ``lease_abandon_stale``) and the
lock rows freed at close (``lease_free``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .claims import take_job_lock
from .cluster import lead, seen
from .database import Database, Params, interval
from .server import ServerSession
from .tables import RunRow

__all__ = [
    "abandon_stale",
    "heartbeat",
    "lease_abandon_stale",
    "lease_free",
    "lease_heartbeat",
    "lease_lock",
    "lock",
]


def lock(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:lock``."""
    namespace, job, run_id = str(p["namespace"]), str(p["job"]), p["run_id"]
    key = int(p["key"])
    fresh_after = db.now - interval(p["stale_after"])
    locked: bool | None
    if not session.is_ours(p["pid"], p["session_token"]):
        locked = None
    elif not db.locks.try_lock(session, key):
        locked = False
    elif any(
        row.outcome is None
        and row.started_at is not None
        and row.run_id != run_id
        and row.heartbeat_at is not None
        and row.heartbeat_at > fresh_after
        for row in db.tables.rows_of(namespace, job)
    ):
        locked = not db.locks.unlock(session, key)
    else:
        locked = True
    if locked and (row := db.tables.runs.get(run_id)) is not None:
        row.started_at = row.heartbeat_at = db.now
        row.lock_key, row.backend_pid = key, session.pid
    return [(locked,)]


def lease_lock(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``lease.sql:lease_lock``."""
    row = db.tables.runs.get(p["run_id"])
    if row is None or row.epoch != p["epoch"] or row.outcome is not None:
        return [(False,)]
    stale_after = interval(p["stale_after"])
    namespace, job, replica = str(p["namespace"]), str(p["job"]), str(p["replica"])
    if not take_job_lock(db, namespace, job, row.run_id, replica, stale_after):
        return [(False,)]
    row.started_at = row.heartbeat_at = db.now
    row.lease_until = db.now + stale_after
    return [(True,)]


def heartbeat(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:heartbeat``."""
    ours = session.is_ours(p["pid"], p["session_token"])
    run_ids: list[int] = list(p["run_ids"])
    refreshed = []
    if ours:
        for run_id in sorted(set(run_ids)):
            row = db.tables.runs.get(run_id)
            if row is not None and row.outcome is None:
                row.heartbeat_at, row.backend_pid = db.now, session.pid
                refreshed.append(row.run_id)
    peers = seen(db, p, session.pid, "advisory")
    leader = lead(db, p) if p["contending"] else (None, None)
    held = db.locks.held_by(session)
    return [(ours, db.now, refreshed, held, peers, *leader)]


def lease_heartbeat(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``lease.sql:lease_heartbeat``."""
    namespace, replica, now = str(p["namespace"]), str(p["replica"]), db.now
    stale_after = interval(p["stale_after"])
    mine = set(zip(p["run_ids"], p["epochs"], strict=True))
    refreshed = []
    for run_id, epoch in sorted(mine):
        row = db.tables.runs.get(run_id)
        if (
            row is not None
            and row.epoch == epoch
            and row.outcome is None
            and row.replica_id == replica
            and _lease_end(row, stale_after) >= now
        ):
            row.heartbeat_at, row.lease_until = now, now + stale_after
            refreshed.append(row.run_id)
    locked_runs: list[object] = list(p["locked_runs"])
    relocked = []
    for lock in db.tables.job_locks.values():
        if (
            lock.namespace == namespace
            and lock.run_id in locked_runs
            and lock.replica_id == replica
            and lock.lease_until is not None
            and lock.lease_until > now
        ):
            lock.lease_until = now + stale_after
            relocked.append(lock.run_id)
    peers = seen(db, p, None, "lease")
    leader = lead(db, p) if p["contending"] else (None, None)
    return [(now, sorted(set(refreshed)), sorted(relocked), peers, *leader, *db.identity)]


def abandon_stale(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:abandon_stale``."""
    stale_after = interval(p["stale_after"])
    gone = []
    for row in db.tables.rows_in(str(p["namespace"])):
        last = row.heartbeat_at or row.claimed_at
        if (
            row.outcome is None
            and last < db.now - stale_after
            and not db.locks.is_held(row.backend_pid, row.lock_key)
        ):
            row.outcome, row.finished_at = "abandoned", last + stale_after
            row.error = f"replica {row.replica_id} stopped heartbeating"
            gone.append((row.job, row.scheduled_at, row.replica_id))
    return gone


def lease_abandon_stale(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``lease.sql:lease_abandon_stale``."""
    namespace = str(p["namespace"])
    stale_after = interval(p["stale_after"])
    gone = []
    for row in db.tables.rows_in(namespace):
        if row.outcome is None and _lease_end(row, stale_after) < db.now:
            row.outcome, row.finished_at = "abandoned", row.lease_until or db.now
            row.epoch += 1
            row.lease_until = None
            row.error = f"replica {row.replica_id} stopped renewing its lease"
            gone.append(row)
    db.tables.free_locks(namespace, (row.run_id for row in gone))
    return [(row.job, row.scheduled_at, row.replica_id) for row in gone]


def lease_free(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``lease.sql:lease_free``."""
    namespace, replica = str(p["namespace"]), str(p["replica"])
    return [(lock.job,) for lock in db.tables.free_locks(namespace, p["run_ids"], replica)]


def _lease_end(row: RunRow, stale_after: timedelta) -> datetime:
    """When the row's lease runs out: ``lease_until``, or without one, its heartbeat gone stale."""
    return row.lease_until or (row.heartbeat_at or row.claimed_at) + stale_after
