"""The embedded backend's housekeeping: the open rows of processes that died are recorded
abandoned, and what is older than the retention pruned (runs, registrations, replicas)."""

from __future__ import annotations

import logging
import sqlite3
import time
from datetime import timedelta

from ._ledger import Ledger
from ._micros import from_micros
from ._sqlite_cluster import prune_registry

__all__ = ["Janitor"]

#: The backend's logger: its records keep the name they are filtered and shown by.
logger = logging.getLogger("replicron.backends.embedded")

#: Rows deleted per transaction, and transactions per janitor run, when pruning.
_PRUNE_BATCH, _PRUNE_BATCHES = 1000, 20


class Janitor:
    """Housekeeping for replica ``replica``: at once with :meth:`run`, and every ``interval``
    seconds from :meth:`restart` on with :meth:`run_when_due`."""

    def __init__(self, replica: str, retention: timedelta, interval: float) -> None:
        self.replica = replica
        self.retention = retention
        self.interval = interval
        self._next = 0.0

    def restart(self) -> None:
        """The next run is due ``interval`` seconds from now."""
        self._next = time.monotonic() + self.interval

    def run_when_due(self, ledger: Ledger) -> None:
        """Run if ``interval`` has passed since the last run; a failure is logged, not raised
        (the next run tries again)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval
        try:
            self.run(ledger)
        except sqlite3.Error as exc:
            logger.warning(
                "embedded backend housekeeping failed: %s",
                exc,
                extra={"event": "lock_error", "replica": self.replica},
            )

    def run(self, ledger: Ledger) -> None:
        for run in ledger.abandon_dead():
            tick = from_micros(run.tick).isoformat()
            logger.warning(
                "job %r tick %s: the process of replica %s died; recorded abandoned",
                run.job,
                tick,
                run.replica,
                extra={"event": "abandoned", "job": run.job, "tick": tick, "replica": self.replica},
            )
        for _ in range(_PRUNE_BATCHES):  # a bounded number of short transactions
            if ledger.prune(self.retention, _PRUNE_BATCH) < _PRUNE_BATCH:
                break
        with ledger.write() as conn:
            prune_registry(conn, self.retention)
