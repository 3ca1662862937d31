"""The runs this replica holds, and the rules they are held by."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._advisory import SessionLocks
from ._lease import Lease

__all__ = ["HeldRuns"]


class HeldRuns:
    """This replica's claimed, unfinished runs, heartbeated until they finish and never
    after; of those, the ones holding their job's lock (``locks``), which run under the
    ``lease``: they are told to stop once no heartbeat has proven them alive for its length.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.locks = SessionLocks()
        self._open: set[int] = set()
        self._stopped: set[int] = set()  # open runs told to stop
        #: Lease mode: the epoch of each open run's row this replica holds.
        self.epochs: dict[int, int] = {}

    def claimed(self, run_id: int, epoch: int = 0) -> None:
        """A tick was claimed for this run: it is heartbeated from now until it finishes."""
        self._open.add(run_id)
        self.epochs[run_id] = epoch

    def locked(self, key: int, run_id: int, sent_at: float) -> None:
        """The run holds its job's lock ``key``, taken by a statement sent at ``sent_at``."""
        self.locks.hold(key, run_id)
        self.lease.start(run_id, sent_at)

    def finished(self, run_ids: Iterable[int]) -> None:
        """These runs stop counting as running here at once: never heartbeated again."""
        ended = list(run_ids)
        self._open.difference_update(ended)
        self._stopped.difference_update(ended)
        self.lease.end(ended)
        for run_id in ended:
            self.epochs.pop(run_id, None)

    def to_heartbeat(self) -> list[int]:
        return sorted(self._open)

    def epoch_of(self, run_id: int | None) -> int | None:
        """Lease mode: the epoch a write about this run names (None: no run, or not open)."""
        return None if run_id is None else self.epochs.get(run_id)

    def heartbeaten(
        self, sent: Sequence[int], refreshed: Sequence[int], sent_at: float
    ) -> set[int]:
        """A heartbeat sent at ``sent_at`` for the runs ``sent`` refreshed the rows
        ``refreshed``: their lease is renewed. Returns the runs it did not refresh that are
        still open: recorded by someone else meanwhile (a janitor that took them for dead),
        they must stop."""
        self.lease.renew(refreshed, sent_at)
        return (set(sent) - set(refreshed)) & self._open

    def lost(self, run_ids: Iterable[int]) -> None:
        """These runs are told to stop: no lease of theirs runs on."""
        stopped = list(run_ids)
        self._stopped.update(stopped)
        self.lease.end(stopped)

    def going_on(self) -> list[int]:
        """The open runs not told to stop yet."""
        return sorted(self._open - self._stopped)

    def session_lost(self) -> list[int]:
        """The session went, and every lock on it: the runs that held one."""
        lost = self.locks.drop_all()
        self._stopped.update(lost)
        self.lease.clear()
        return lost

    def close(self) -> None:
        self.lease.clear()
        self.locks.drop_all()
        self.epochs.clear()
        self._stopped.clear()
