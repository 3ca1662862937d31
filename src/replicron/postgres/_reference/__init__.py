"""The reference ledger: a model of the PostgreSQL ledger in plain Python, with one function
per named statement of ``sql/queries.sql`` and ``sql/lease.sql`` that the protocol runs,
answering as the SQL does (the same rows, the same errors) against a clock the caller sets.

It is what a simulation runs replicas against instead of a server. It is held equal to the
SQL by ``tests/postgres/test_reference_ledger.py``, which runs random sequences of
statements on both and compares every answer and, after each, every table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from . import claims, cluster, liveness, outcomes, registry
from .database import Database, Params
from .server import ServerSession
from .tables import JobLockRow, LeaderRow, ReplicaRow, RunRow, StatementError, Tables

__all__ = [
    "STATEMENTS",
    "Database",
    "JobLockRow",
    "LeaderRow",
    "ReferenceLedger",
    "ReplicaRow",
    "RunRow",
    "ServerSession",
    "StatementError",
    "Tables",
]

Statement = Callable[[Database, ServerSession, Params], list[tuple[Any, ...]]]

#: Every statement the model answers, by its name in the SQL files.
STATEMENTS: dict[str, Statement] = {
    "claim": claims.claim,
    "lease_claim": claims.lease_claim,
    "lock": liveness.lock,
    "lease_lock": liveness.lease_lock,
    "release": outcomes.release,
    "lease_release": outcomes.lease_release,
    "record_unclaimed": outcomes.record_unclaimed,
    "record_missed_ranges": outcomes.record_missed_ranges,
    "close_lost_claims": outcomes.close_lost_claims,
    "heartbeat": liveness.heartbeat,
    "lease_heartbeat": liveness.lease_heartbeat,
    "abandon_stale": liveness.abandon_stale,
    "lease_abandon_stale": liveness.lease_abandon_stale,
    "lease_free": liveness.lease_free,
    "leader_lease": cluster.leader_lease,
    "leader_now": cluster.leader_now,
    "leader_resign": cluster.leader_resign,
    "pause": cluster.pause,
    "resume": cluster.resume,
    "last_ticks": cluster.last_ticks,
    "last_finishes": cluster.last_finishes,
    "database_clock": cluster.database_clock,
    "clock_sample": cluster.clock_sample,
    "other_modes": registry.other_modes,
    "replica_joined": registry.replica_joined,
    "replica_stopped": registry.replica_stopped,
    "replicas_staying": registry.replicas_staying,
    "announce": registry.announce,
    "run_requests": registry.run_requests,
    "request_run": registry.request_run,
    "prune": registry.prune,
    "prune_registry": registry.prune_registry,
    "server_identity": registry.server_identity,
}

#: The statements whose rows come in an order the SQL fixes (ORDER BY, or one row); the
#: others' order is the server's to choose, so their rows are a multiset, and so are the
#: arrays built from a data-modifying step's rows.
ORDERED = frozenset(
    {
        "claim",
        "lease_claim",
        "lock",
        "lease_lock",
        "release",
        "lease_release",
        "heartbeat",
        "lease_heartbeat",
        "leader_lease",
        "leader_now",
        "database_clock",
        "clock_sample",
        "replicas_staying",
        "announce",
        "run_requests",
        "request_run",
        "prune",
        "server_identity",
    }
)


class ReferenceLedger:
    """One server: its state (``db``) and its server sessions. Each :meth:`execute` is one
    statement in a transaction of its own at the instant ``db.now``."""

    def __init__(self, now: datetime) -> None:
        self.db = Database(now)
        self._sessions: dict[int, ServerSession] = {}
        self._next_pid = 1000

    def connect(self, pid: int | None = None, **settings: str) -> ServerSession:
        """A new server session (a pid of its own unless given)."""
        if pid is None:
            self._next_pid += 1
            pid = self._next_pid
        session = ServerSession(pid, dict(settings))
        self._sessions[pid] = session
        return session

    def sessions(self) -> list[ServerSession]:
        """The server sessions open now."""
        return list(self._sessions.values())

    def disconnect(self, session: ServerSession) -> None:
        """The session ends (closed, or its connection lost): its advisory locks go."""
        self._sessions.pop(session.pid, None)
        self.db.session_ended(session)

    def execute(self, name: str, session: ServerSession, params: Params) -> list[tuple[Any, ...]]:
        """The rows statement ``name`` answers with ``params``, or :class:`StatementError`."""
        if session.closed:
            raise StatementError("08003", "the connection is closed")
        return STATEMENTS[name](self.db, session, params)
