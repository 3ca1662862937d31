"""The runs this replica holds, and the rules they are held by."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._deadline import RunDeadline

__all__ = ["HeldLocks", "HeldRuns"]


class HeldLocks:
    """The job locks this replica holds (on its lock session, or as lock rows): lock key ->
    the run holding it."""

    def __init__(self) -> None:
        self._run_of: dict[int, int] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._run_of

    def hold(self, key: int, run_id: int) -> None:
        self._run_of[key] = run_id

    def take(self, key: int, run_id: int | None) -> bool:
        """Whether the finished run ``run_id`` is to unlock ``key``: only a lock still held for
        this run (after a lost session or lease the lock is gone, and another replica may
        hold the key now). A key taken counts as unlocked: ``hold`` it again if the
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
        """These runs' locks are gone (or about to be): this replica unlocks none of them."""
        ended = set(run_ids)
        for key in [key for key, run in self._run_of.items() if run in ended]:
            del self._run_of[key]

    def drop_all(self) -> list[int]:
        """Every lock is gone (with the session that held them): the runs that held them."""
        lost = list(self._run_of.values())
        self._run_of.clear()
        return lost

    def missing(self, present: Iterable[int], unrefreshed: set[int]) -> list[int]:
        """The runs whose lock key is not among the keys ``present``, or whose row a
        heartbeat no longer refreshed."""
        keys = set(present)
        return [run for key, run in self._run_of.items() if key not in keys or run in unrefreshed]


class HeldRuns:
    """This replica's claimed, unfinished runs, heartbeated until they finish and never
    after; of those, the ones holding their job's lock (``locks``), which run under the
    run ``deadline``: they are told to stop once no heartbeat has proven them alive for its
    length.
    """

    def __init__(self, deadline: RunDeadline) -> None:
        self.deadline = deadline
        self.locks = HeldLocks()
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
        self.deadline.start(run_id, sent_at)

    def finished(self, run_ids: Iterable[int]) -> None:
        """These runs stop counting as running here at once: never heartbeated again."""
        ended = list(run_ids)
        self._open.difference_update(ended)
        self._stopped.difference_update(ended)
        self.deadline.end(ended)
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
        ``refreshed``: their deadline is renewed. Returns the runs it did not refresh that are
        still open: recorded by someone else meanwhile (a janitor that took them for dead),
        they must stop."""
        self.deadline.renew(refreshed, sent_at)
        return (set(sent) - set(refreshed)) & self._open

    def lost(self, run_ids: Iterable[int]) -> None:
        """These runs are told to stop: no deadline of theirs runs on."""
        stopped = list(run_ids)
        self._stopped.update(stopped)
        self.deadline.end(stopped)

    def going_on(self) -> list[int]:
        """The open runs not told to stop yet."""
        return sorted(self._open - self._stopped)

    def session_lost(self) -> list[int]:
        """The session went, and every lock on it: the runs that held one."""
        lost = self.locks.drop_all()
        self._stopped.update(lost)
        self.deadline.clear()
        return lost

    def close(self) -> None:
        self.deadline.clear()
        self.locks.drop_all()
        self.epochs.clear()
        self._stopped.clear()
