"""Noticing that the server changed under the replica (a failover), and what follows.

A multi-host DSN (``host=a,b target_session_attrs=read-write``) takes a replica to whichever
server accepts writes: after a failover, a promoted standby. With synchronous replication it
has every commit the old primary acknowledged; with asynchronous replication it may lack the
last ones, claims among them, and a tick whose claim is gone could be claimed and run again.

So the replica reads the server's identity (system identifier and timeline) on every new
connection (and, in lease mode, on every heartbeat, whose connections may come from a pool),
and when it changes it says so once, at ERROR, naming both; counts it; stops the runs it
holds (recorded ``abandoned``: whether their rows and locks made it across is not known);
moves the run id sequence past the ids it was given, so run ids stay fencing tokens; and puts
back the rows it wrote lately that the new server lacks. A row it put back that meets one
another replica wrote for the same tick meanwhile is a tick claimed twice: said at ERROR.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from replicron.backends.base import RunRecord

from ._sql import queries

__all__ = ["JOURNAL_SPAN", "RowJournal", "ServerIdentity", "ServerWatch"]

#: The backend's records keep the logger they are documented under.
logger = logging.getLogger("replicron.postgres.backend")

#: How long this replica remembers the rows it wrote, to put back after a failover (seconds):
#: far longer than any asynchronous standby should lag.
JOURNAL_SPAN = 600.0
#: At most this many rows are remembered (the oldest go first).
JOURNAL_ROWS = 10_000

Run = Callable[[str, Mapping[str, Any]], Awaitable[list[tuple[Any, ...]]]]


class ServerIdentity(NamedTuple):
    """Which server a connection reached: a promotion bumps the timeline; another cluster has
    another system identifier."""

    system: int
    timeline: int

    def __str__(self) -> str:
        return f"system {self.system} timeline {self.timeline}"


class _Row:
    __slots__ = ("error", "finished", "manual", "outcome", "run_id", "seen", "started")

    def __init__(self, run_id: int | None, manual: bool) -> None:
        self.run_id, self.manual = run_id, manual
        self.outcome: str | None = None
        self.started: datetime | None = None
        self.finished: datetime | None = None
        self.error: str | None = None
        self.seen = time.monotonic()


class RowJournal:
    """The ledger rows this replica wrote lately, by tick: what it would put back."""

    def __init__(self, span: float = JOURNAL_SPAN, limit: int = JOURNAL_ROWS) -> None:
        self._span, self._limit = span, limit
        self._rows: OrderedDict[tuple[str, datetime], _Row] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def claimed(self, job: str, tick: datetime, run_id: int, manual: bool = False) -> None:
        self._rows[(job, tick)] = _Row(run_id, manual)
        self._trim()

    def ended(self, record: RunRecord) -> None:
        """Its outcome was written (or recorded without a run)."""
        key = (record.job, record.scheduled_at)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row(record.run_id, record.manual)
        row.outcome, row.error = record.outcome.value, record.error
        row.started, row.finished = record.started_at, record.finished_at
        self._trim()

    def rows(self) -> list[tuple[str, datetime, _Row]]:
        self._trim()
        return [(job, tick, row) for (job, tick), row in self._rows.items()]

    def _trim(self) -> None:
        old = time.monotonic() - self._span
        while self._rows and (
            len(self._rows) > self._limit or next(iter(self._rows.values())).seen < old
        ):
            self._rows.popitem(last=False)


class ServerWatch:
    """The identity of the server this replica talks to, and what it does when it changes.
    ``held`` gives the runs the replica holds; ``lose`` stops them (recorded abandoned)."""

    def __init__(
        self,
        namespace: str,
        *,
        held: Callable[[], list[int]],
        lose: Callable[[list[int]], None],
        on_change: Callable[[ServerIdentity, ServerIdentity], None] = lambda _a, _b: None,
    ) -> None:
        self.namespace = namespace
        self.replica_id = ""
        self.journal = RowJournal()
        #: The server seen last (None before the first connection).
        self.identity: ServerIdentity | None = None
        #: How many times the server changed under this replica.
        self.changes = 0
        self._held, self._lose, self._on_change = held, lose, on_change
        self._queries = queries()
        self._unreadable = False

    async def check(self, run: Run) -> None:
        """Read the server's identity through ``run`` (a statement on the connection just
        opened, or the backend's own); on a change, do what a failover asks."""
        if self._unreadable:
            return
        try:
            [(system, timeline)] = await run(self._queries["server_identity"], {})
        except psycopg.errors.InsufficientPrivilege as exc:
            self._unreadable = True
            logger.warning(
                "cannot read the server's identity (%s): a failover will not be noticed",
                exc,
                extra={"event": "lock_error", "replica": self.replica_id},
            )
            return
        self.seen(ServerIdentity(int(system), int(timeline)))
        if self._pending is not None:
            await self._restore(run, self._pending)

    _pending: ServerIdentity | None = None

    def seen(self, identity: ServerIdentity) -> None:
        """The server is ``identity``: if it was another, say so and stop the held runs (the
        rows go back with the next :meth:`check`, or :meth:`restore`)."""
        old = self.identity
        self.identity = identity
        if old is None or old == identity:
            return
        self.changes += 1
        held = self._held()
        logger.error(
            "the server changed under this replica (failover): was %s, now %s. With "
            "asynchronous replication, what the old primary committed last may be lost; "
            "stopping %d held runs (recorded abandoned) and putting back the ledger rows this "
            "replica wrote that the new server lacks",
            old,
            identity,
            len(held),
            extra={"event": "server_changed", "replica": self.replica_id},
        )
        self._pending = identity
        self._on_change(old, identity)
        if held:
            self._lose(held)

    @property
    def pending(self) -> bool:
        """A change was seen whose rows are not put back yet."""
        return self._pending is not None

    async def restore(self, run: Run) -> None:
        if self._pending is not None:
            await self._restore(run, self._pending)

    async def _restore(self, run: Run, identity: ServerIdentity) -> None:
        """Put the journal's rows back. Lost with its connection, it stays to do on the next
        one; refused by the server, it is given up (said at ERROR)."""
        rows = self.journal.rows()
        try:
            answers = await self._put_back(run, identity, rows) if rows else []
        except (psycopg.OperationalError, TimeoutError, ConnectionError):
            raise
        except psycopg.Error as exc:
            self._pending = None
            logger.error(
                "could not put back the ledger rows this replica wrote before the failover: %s",
                exc,
                extra={"event": "lock_error", "replica": self.replica_id},
            )
            return
        self._pending = None
        if rows:
            self._report(rows, answers)

    async def _put_back(
        self, run: Run, identity: ServerIdentity, rows: Sequence[tuple[str, datetime, _Row]]
    ) -> list[tuple[Any, ...]]:
        run_ids = [row.run_id for _, _, row in rows if row.run_id is not None]
        try:
            if run_ids:
                await run(self._queries["bump_run_ids"], {"upto": max(run_ids)})
        except psycopg.errors.InsufficientPrivilege as exc:
            logger.warning(
                "cannot move the run id sequence past this replica's run ids (%s): run ids "
                "given out on the old primary may be given out again",
                exc,
                extra={"event": "lock_error", "replica": self.replica_id},
            )
        note = f"put back after a failover to {identity}"
        return await run(
            self._queries["restore_rows"],
            {
                "namespace": self.namespace,
                "replica": self.replica_id,
                "run_ids": [row.run_id for _, _, row in rows],
                "jobs": [job for job, _, _ in rows],
                "ticks": [tick for _, tick, _ in rows],
                "outcomes": [row.outcome or "abandoned" for _, _, row in rows],
                "started": [row.started for _, _, row in rows],
                "finished": [row.finished for _, _, row in rows],
                "errors": [row.error or (None if row.outcome else note) for _, _, row in rows],
                "manual": [row.manual for _, _, row in rows],
            },
        )

    def _report(
        self, rows: Sequence[tuple[str, datetime, _Row]], answers: Sequence[tuple[Any, ...]]
    ) -> None:
        lacked = outcomes = held = missed = 0
        for (job, tick, row), (_, what, replica, run_id, outcome) in zip(
            rows, answers, strict=True
        ):
            if what == "restored":
                lacked += 1
            elif what == "replaced" and outcome == "missed":
                missed += 1
            elif what == "replaced":
                outcomes += 1
                held += row.outcome is None
            elif (
                row.started is not None
                and replica != self.replica_id
                and outcome
                not in (
                    "missed",
                    "skipped_overlap",
                    "skipped_limit",
                    "paused",
                )
            ):
                logger.error(
                    "job %r tick %s ran here as run %s (its row lost in the failover) and was "
                    "claimed again on the new server by replica %s as run %s (%s): it may have "
                    "run twice",
                    job,
                    tick.isoformat(),
                    row.run_id,
                    replica,
                    run_id,
                    outcome,
                    extra={
                        "event": "claimed_twice",
                        "job": job,
                        "tick": tick.isoformat(),
                        "replica": self.replica_id,
                    },
                )
        logger.warning(
            "after the failover, of the %d ledger rows this replica wrote lately the new "
            "server lacked %d (put back) and the outcome of %d (written; %d of them runs held "
            "here, recorded abandoned), and had %d that ran here recorded missed (replaced)",
            len(rows),
            lacked,
            outcomes,
            held,
            missed,
            extra={"event": "server_changed", "replica": self.replica_id},
        )
