"""The state a statement runs against: the tables, the advisory locks, the server's clock
and identity."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .server import AdvisoryLocks, ServerSession
from .tables import RAN, RunRow, Tables

__all__ = ["Database", "Params"]

#: A statement's parameters, by the names its SQL gives them.
Params = Mapping[str, Any]


@dataclass
class Database:
    """One server's state. ``now`` is what the SQL's ``now()`` and ``clock_timestamp()``
    answer (one instant per statement: the caller sets it); ``identity`` what
    ``server_identity`` reads (system identifier, timeline)."""

    now: datetime
    tables: Tables = field(default_factory=Tables)
    locks: AdvisoryLocks = field(default_factory=AdvisoryLocks)
    identity: tuple[int, int] = (0, 1)

    def runs_reached(self, namespace: str, job: str, limit: int, mine: list[object]) -> bool:
        """``replicron_runs_reached(namespace, job, limit, mine)``."""
        count = self.tables.pruned_runs.get((namespace, job), 0)
        for row in self._scheduled_rows(namespace, job, mine):
            if row.outcome in RAN or (row.outcome is None and self._counts_running(row)):
                count += 1
        return count >= limit

    def last_run(self, namespace: str, job: str, mine: list[object]) -> datetime | None:
        """The latest tick of ``job``'s scheduled rows that are runs or open, less the
        caller's own tries (``record_unclaimed``'s ``finished.last_run``)."""
        ticks = [
            row.scheduled_at
            for row in self._scheduled_rows(namespace, job, mine)
            if row.outcome is None or row.outcome in RAN
        ]
        return max(ticks, default=None)

    def _scheduled_rows(self, namespace: str, job: str, mine: list[object]) -> Iterator[RunRow]:
        """``job``'s rows of its schedule's ticks (not manual runs), less the rows of the
        caller's own tries (claim tokens in ``mine``)."""
        for row in self.tables.rows_of(namespace, job):
            if not row.manual and not (row.claim_token is not None and row.claim_token in mine):
                yield row

    def _counts_running(self, row: RunRow) -> bool:
        lock = self.tables.job_locks.get((row.namespace, row.job))
        return (
            row.started_at is None
            or self.locks.is_held(row.backend_pid, row.lock_key)
            or (lock is not None and lock.run_id == row.run_id)
            or self._written_off_but_in_name(row)
        )

    def _written_off_but_in_name(self, row: RunRow) -> bool:
        """What a janitor would record abandoned: a row whose lease ran out, or (advisory)
        whose replica's heartbeats are stale by that replica's own ``stale_after``."""
        if row.lease_until is not None and row.lease_until < self.now:
            return True
        if row.backend_pid is None:
            return False
        seen = self.tables.replicas.get((row.namespace, row.replica_id))
        if seen is None or seen.stale_after is None:
            return False
        last = row.heartbeat_at if row.heartbeat_at is not None else row.claimed_at
        return last < self.now - seen.stale_after

    def session_ended(self, session: ServerSession) -> None:
        session.closed = True
        self.locks.session_ended(session)


def interval(value: object) -> timedelta:
    """A parameter cast to ``interval``: replicron sends a ``timedelta``."""
    if not isinstance(value, timedelta):
        raise TypeError(f"an interval parameter must be a timedelta, not {value!r}")
    return value
