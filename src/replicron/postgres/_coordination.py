"""The seam between the coordination protocol and the two ways of holding a job's lock.

The protocol (docs/protocol.md) is written once, in the backend and its housekeeper: claim a
tick by inserting its row, start a run only under its job's lock, heartbeat what is held,
stop a run whose liveness cannot be proven before anyone may take over, write its outcome as
its holder, write off the runs of replicas gone quiet. What a mode supplies is its liveness
rule and the SQL and session that carry it:

* advisory (``_advisory.AdvisoryLocks``): the lock is a session advisory lock, live while
  the replica's lock session holds it;
* row lease (``_row_lease.RowLeases``): the lock is a row of ``replicron_job_locks``, live
  while its ``lease_until`` is ahead of the server's now.

``PostgresBackend`` picks one of them (``backend.py:_coordination_for``); outside the
implementations nothing else branches on the mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from replicron.backends.base import Claim, ClaimRequest, RunRecord

from ._claims import ClaimRow
from ._failover import ServerIdentity
from ._runs import HeldRuns
from ._session import LockSession
from ._setting_names import SettingNames

__all__ = ["Beat", "Coordination", "CoordinationMode", "Won"]

#: How replicas coordinate: ``"advisory"`` (a lock session per replica holding a session
#: advisory lock per running tick) or ``"lease"`` (the ledger row is the lock; no session state,
#: so a transaction pooler may sit in between). See docs/postgres.md.
CoordinationMode = Literal["advisory", "lease"]

#: A claimed tick's row, and the epoch this replica holds it in.
Won = dict[tuple[str, datetime], tuple[ClaimRow, int]]


@dataclass(frozen=True)
class Beat:
    """What a heartbeat found."""

    db_now: datetime
    #: The replicas of the namespace seen lately.
    peers: Sequence[str]
    #: Leader mode: the leader term's holder and epoch, if this replica contends.
    leader: tuple[str | None, int | None]
    #: The server answering, where the mode reads it with every heartbeat.
    server: ServerIdentity | None
    #: The open runs whose rows it refreshed, and when it was sent (monotonic).
    refreshed: Sequence[int]
    sent_at: float
    #: Given the open runs it did not refresh, the held runs that must stop: the heartbeat
    #: could not prove their locks (or rows) still theirs.
    lost: Callable[[set[int]], list[int]]


class Coordination(Protocol):
    """How a job's lock is held and proven live: the statements and the session of one mode."""

    #: The mode's name, as a replica announces it (replicas of two modes never share a
    #: namespace: their locks do not see each other).
    name: CoordinationMode
    #: What a replica that lost them lost, for its log line.
    locks_noun: str

    def session(
        self,
        conninfo: str,
        pool: AsyncConnectionPool[Any] | None,
        on_lost: Callable[[], None],
        **options: Any,
    ) -> LockSession:
        """The session the backend's statements run on; ``on_lost`` if losing its
        connection loses the locks."""
        ...

    async def check_server(
        self, conninfo: str, connect_timeout: float, setting_names: SettingNames
    ) -> None:
        """At open, once connected: refuse a server the mode cannot coordinate through."""
        ...

    async def claim(
        self,
        unique: Sequence[ClaimRequest],
        keys: Sequence[int],
        tokens: Sequence[UUID],
        replica: str,
    ) -> Won:
        """Claim the ticks (their jobs' lock ``keys``, the claim ``tokens`` that let a retry
        recognise a first try's rows); the rows won (absent: somebody has the tick)."""
        ...

    async def lock(self, claim: Claim, key: int, epoch: int | None, replica: str) -> bool:
        """Take the job's lock for the claimed run; False if another run holds it."""
        ...

    def locks_survive(self, session: LockSession, generation: int) -> bool:
        """Whether the locks held when the session was at ``generation`` are held still."""
        ...

    async def release(
        self,
        params: dict[str, Any],
        unlocking: Sequence[tuple[int, RunRecord]],
        generation: int,
        replica: str,
    ) -> tuple[Sequence[bool], Sequence[str | None]]:
        """Write outcomes and unlock ``unlocking`` in one statement: which rows it wrote, and
        what each row said before."""
        ...

    async def heartbeat(self, runs: HeldRuns, run_ids: Sequence[int], **params: Any) -> Beat:
        """Refresh the rows ``run_ids`` of ``runs`` and whatever else the mode renews."""
        ...

    async def abandon_stale(self, stale_after: timedelta) -> list[Any]:
        """Janitor: write off the open rows whose holder's liveness ended."""
        ...

    def deadline_passed(self) -> None:
        """A locked run's deadline passed: no lock of this replica may outlive it."""
        ...

    async def free_locks(self, run_ids: Sequence[int], replica: str) -> None:
        """Shutting down: the locks still held go."""
        ...
