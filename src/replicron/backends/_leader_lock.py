"""The embedded backend's leader lease: a file lock in the state directory, taken without
waiting and held until the process closes its backend or ends (the kernel drops it then, so
a standby takes over at its next try after a kill -9). The ledger's ``replicron_leaders`` row
names the holder and counts the changes of holder (the epoch).

A process frozen (SIGSTOP) keeps its lock, as it keeps its runs' locks: on one host, nothing
else may take over from a process that can still wake up and write.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ._call_thread import OnThread
from ._file_locks import release, try_hold
from ._ledger import Ledger, now_us
from ._sql import sql
from .leadership import Leader

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = ["LEADER_LOCK", "LeaderCandidate", "LeaderLock"]

logger = logging.getLogger("replicron.backends.embedded")

#: The leader lease's lock file, in the state directory.
LEADER_LOCK = "leader.lock"


class LeaderLock:
    """One handle's side of the leader lease (its calls run on the backend's thread)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._lock: FileLock | None = None
        #: Whether this handle holds the lease.
        self.held = False
        self.leader: Leader | None = None

    def attempt(self, conn: sqlite3.Connection, replica: str) -> bool:
        """Take the lease if it is free (and write this replica its holder), else read who
        holds it; in the write transaction ``conn``. Returns whether it was taken now."""
        import filelock  # on first use, as for the run locks

        taken = False
        if not self.held:
            if self._lock is None:
                self._lock = filelock.FileLock(self.path, timeout=0, thread_local=False)
            taken = try_hold(self.path, self._lock)
            if taken:
                try:
                    conn.execute(sql("leader_taken"), {"replica": replica, "now": now_us()})
                except BaseException:  # not written the holder: not held
                    release(self.path, self._lock)
                    raise
        self.held = self.held or taken
        row = conn.execute(sql("leader_seen")).fetchone()
        self.leader = None if row is None else Leader(row[0], row[1])
        return taken

    def unlock(self) -> None:
        if self.held and self._lock is not None:
            self.held = False
            release(self.path, self._lock)


class LeaderCandidate:
    """One backend handle's bid for the leader lease: from :meth:`contend` on, it tries the
    lock file at ``path`` every ``retry`` seconds (through ``on_thread``, in the handle's open
    ``ledger``, as ``replica``) until it takes it; it holds it until :meth:`resign`."""

    def __init__(
        self,
        path: Path,
        retry: float,
        *,
        on_thread: OnThread,
        ledger: Callable[[], Ledger],
        replica: Callable[[], str],
    ) -> None:
        self._lock = LeaderLock(path)
        self._retry = retry
        self._on_thread = on_thread
        self._ledger = ledger
        self._replica = replica
        self._seeking: asyncio.Task[None] | None = None

    def contend(self, on_change: Callable[[], None]) -> None:
        if self._seeking is None:
            self._seeking = asyncio.get_running_loop().create_task(self._seek(on_change))

    def leading(self) -> bool:
        return self._lock.held

    @property
    def leader(self) -> Leader | None:
        return self._lock.leader

    def stop_seeking(self) -> None:
        """No more tries (the backend closes); a lease taken is held until :meth:`resign`."""
        if self._seeking is not None:
            self._seeking.cancel()
            self._seeking = None

    def resign(self) -> None:
        """Let go of the lease, if held: a standby takes over at its next try. On the
        backend's thread."""
        self._lock.unlock()

    async def _seek(self, on_change: Callable[[], None]) -> None:
        while True:
            try:
                if await self._on_thread(self._lead):
                    on_change()
                    return
            except Exception as exc:  # tried again: a busy ledger, or not open (yet)
                logger.warning(
                    "could not seek the leader lease: %s",
                    exc,
                    extra={"event": "lock_error", "replica": self._replica()},
                )
            await asyncio.sleep(self._retry)

    def _lead(self) -> bool:
        with self._ledger().write() as conn:
            return self._lock.attempt(conn, self._replica())
