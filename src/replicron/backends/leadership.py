"""Leader mode's seam: a backend that keeps one leader lease per namespace.

Leader mode changes which replica *tries* to claim a leader-mode job's ticks (the leader
only); the claim itself stays the unique ledger row, so the exactly-once promise does not rest
on the lease. A replica that contends for the lease holds it by a compare-and-set on its
expiry (PostgreSQL: on the database's clock, renewed with the heartbeat), or by a lock the
kernel drops with its process (embedded), or by being first (memory).

:class:`LeaderTerm` is this replica's side of a lease that runs out: it counts itself leader
until the end of its last renewal measured on its own monotonic clock from *before* the
renewal was sent, which is never later than the end the server stamped, so a leader cut off
or frozen stops claiming before any other replica may take the lease over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = ["Leader", "LeaderLease", "LeaderTerm"]


class Leader(NamedTuple):
    """The holder of the lease as last seen, and its epoch (bumped on every change of
    holder)."""

    holder: str
    epoch: int


@runtime_checkable
class LeaderLease(Protocol):
    """A backend whose replicas can elect one leader among those that contend."""

    def contend(self, on_change: Callable[[], None]) -> None:
        """From now on (the backend open), seek the lease and hold it while this replica
        lives; ``on_change`` is called (from any thread) whenever :meth:`leading` may have
        changed."""

    def leading(self) -> bool:
        """Whether this replica holds the lease now, by its own clock (self-fenced)."""

    @property
    def leader(self) -> Leader | None:
        """The holder as last seen (``None``: nobody, or not known yet)."""


def _ignore() -> None:
    pass


class LeaderTerm:
    """This replica's term as leader of a lease with an expiry: held until a monotonic
    instant, told to ``on_change`` as it starts and ends (an end without a renewal wakes it
    through a timer on the loop)."""

    def __init__(self, replica_id: str = "") -> None:
        self.replica_id = replica_id
        self.on_change: Callable[[], None] = _ignore
        #: Whether this replica seeks the lease (it has leader-mode jobs).
        self.contending = False
        self.leader: Leader | None = None
        self._until = 0.0  # monotonic; 0: not leading
        self._timer: asyncio.TimerHandle | None = None

    def contend(self, on_change: Callable[[], None]) -> None:
        self.on_change, self.contending = on_change, True

    def leading(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self._until

    def seen(self, holder: str | None, epoch: int, sent_at: float, length: float) -> None:
        """A renewal sent at ``sent_at`` (monotonic) found ``holder`` with ``epoch``: if this
        replica, it leads until ``length`` seconds after the send."""
        was = self.leading()
        self.leader = None if holder is None else Leader(holder, epoch)
        if holder == self.replica_id and holder:
            self._until = sent_at + length
            self._end_timer(sent_at + length)
        else:
            self._until = 0.0
        if self.leading() != was:
            self.on_change()

    def resigned(self) -> None:
        """This replica gave the lease up (it stops): it leads no more."""
        was = self.leading()
        self._until, self.contending = 0.0, False
        if self.leader is not None and self.leader.holder == self.replica_id:
            self.leader = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if was:
            self.on_change()

    def _end_timer(self, until: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(RuntimeError):  # no loop: leading() is read on demand
            loop = asyncio.get_running_loop()
            # The loop's clock is time.monotonic(): wake just after the term's end.
            self._timer = loop.call_at(until + 0.001, self._ended)

    def _ended(self) -> None:
        self._timer = None
        if not self.leading():
            self.on_change()
