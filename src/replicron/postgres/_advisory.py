"""What coordinating through session advisory locks adds to what every mode does.

A job's lock is a session advisory lock on the replica's lock session, so it lives and dies
with that session: the replica keeps which run holds which key (and unlocks only those), each
heartbeat checks them in ``pg_locks``, and a statement that ran on another server session
than the lock session's (a transaction pooler in between, where no session lock holds) ends
all coordination through it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import NoReturn

from replicron.backends.base import RunRecord

from ._session import TransactionPoolerError
from ._setting_names import PYTHON_NAMES
from ._statements import Statements

__all__ = ["SessionLocks", "refuse_pooler", "report_unheld"]

#: The backend's records keep the logger they are documented under.
logger = logging.getLogger("replicron.postgres.backend")


class SessionLocks:
    """The job locks this replica holds on its lock session: lock key -> the run holding it."""

    def __init__(self) -> None:
        self._run_of: dict[int, int] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._run_of

    def hold(self, key: int, run_id: int) -> None:
        self._run_of[key] = run_id

    def take(self, key: int, run_id: int | None) -> bool:
        """Whether the finished run ``run_id`` is to unlock ``key``: only a lock this session
        still holds for this run (after a lost session the lock is gone, and another replica
        may hold the key now). A key taken counts as unlocked: ``hold`` it again if the
        unlock did not happen."""
        if self._run_of.get(key, -1) != run_id:
            return False
        del self._run_of[key]
        return True

    def runs(self) -> list[int]:
        """The runs holding a lock, in run order."""
        return sorted(self._run_of.values())

    def give_back(self, key: int, run_id: int | None) -> None:
        """A lock taken to be unlocked is still held: its unlock was rolled back."""
        assert run_id is not None  # taken for the run holding it
        self._run_of[key] = run_id

    def forget(self, run_ids: Iterable[int]) -> None:
        """These runs' locks are gone (or about to be): this session unlocks none of them."""
        ended = set(run_ids)
        for key in [key for key, run in self._run_of.items() if run in ended]:
            del self._run_of[key]

    def drop_all(self) -> list[int]:
        """The session is gone, and every lock with it: the runs that held them."""
        lost = list(self._run_of.values())
        self._run_of.clear()
        return lost

    def missing(self, in_pg_locks: Iterable[int], unrefreshed: set[int]) -> list[int]:
        """The runs whose lock the session no longer holds by ``pg_locks`` (keys as the
        server reads them: unsigned), or whose row a heartbeat no longer refreshed."""
        present = {(key - (1 << 64)) if key >= 1 << 63 else key for key in in_pg_locks}
        return [
            run for key, run in self._run_of.items() if key not in present or run in unrefreshed
        ]


def refuse_pooler(statements: Statements, replica_id: str) -> NoReturn:
    """A statement ran on another server session than the lock session's: a transaction
    pooler is in between. Nothing was locked or unlocked there; the session is given up, and
    every later statement is refused: coordination through it cannot be trusted."""
    names = statements.session.setting_names if statements.session else PYTHON_NAMES
    refusal = TransactionPoolerError(
        "a statement of the lock session ran on another server session: the connection "
        "goes through a transaction pooler, where session advisory locks do not hold; "
        f"this replica coordinates nothing more. {names.behind_a_pooler()}."
    )
    statements.refuse(refusal)
    logger.error("%s", refusal, extra={"event": "lock_error", "replica": replica_id})
    raise refusal


def report_unheld(
    unlocking: Sequence[tuple[int, RunRecord]],
    unlocked: Sequence[bool | None],
    replica_id: str,
    *,
    leased: bool = False,
) -> None:
    """Say which of the locks a release unlocked the session turned out not to hold. In lease
    mode that is expected of a run whose lease ended (it fenced itself; a janitor freed its
    job's lock row), so it is a warning there, and an error of the session's in advisory."""
    for (key, record), released in zip(unlocking, unlocked, strict=False):
        if released is False and leased:
            logger.warning(
                "job %r: its lock was no longer run %s's at release (its lease had ended and "
                "a janitor freed it, or an earlier try of this release did)",
                record.job,
                record.run_id,
                extra={"event": "lock_error", "job": record.job, "replica": replica_id},
            )
        elif released is False:
            logger.error(
                "job %r: advisory lock %s was not held at unlock",
                record.job,
                key,
                extra={"event": "lock_error", "job": record.job, "replica": replica_id},
            )
