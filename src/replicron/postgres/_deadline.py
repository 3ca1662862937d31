"""The run deadline: the replica's side of its runs' liveness (self-fencing).

Other replicas treat a run as live until its row's ``heartbeat_at`` (stamped by the database
when a heartbeat or the claim ran) plus ``stale_after``. The replica measures the same span
on its own monotonic clock from when that heartbeat or claim was *sent*, which is earlier, and
gives it a shorter length: so its runs are told to stop before any other replica may start
the job, whatever the network, keepalives or server do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

__all__ = ["RunDeadline"]


class RunDeadline:
    """When each locked run's liveness was last proven, and a timer that fires ``on_expiry``
    with the runs whose deadline passed."""

    def __init__(self, length: float, on_expiry: Callable[[list[int]], None]) -> None:
        self.length = length
        self._on_expiry = on_expiry
        self._proven: dict[int, float] = {}  # run id -> loop time its liveness was proven
        self._timer: asyncio.TimerHandle | None = None

    def __contains__(self, run_id: int) -> bool:
        return run_id in self._proven

    def start(self, run_id: int, sent_at: float) -> None:
        """The run's claim (or lock) was sent at ``sent_at`` and succeeded."""
        self._proven[run_id] = sent_at
        # Only an earlier expiry moves the timer: a batch of n claims must not look for the
        # earliest of all n times over (a timer that fires early finds nothing and rearms).
        timer = self._timer
        if timer is None or sent_at + self.length < timer.when():
            self._rearm()

    def renew(self, run_ids: Iterable[int], sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` refreshed these runs' rows. A deadline that had already
        ended when it was sent stays ended: its run may have stopped on it (and the timer
        tells the scheduler so), whatever the server still held."""
        for run_id in run_ids:
            proven = self._proven.get(run_id)
            if proven is not None and proven < sent_at < proven + self.length:
                self._proven[run_id] = sent_at
        self._rearm()

    def end(self, run_ids: Iterable[int]) -> None:
        for run_id in run_ids:
            self._proven.pop(run_id, None)
        self._rearm()

    def clear(self) -> None:
        self._proven.clear()
        self._rearm()

    def end_of(self, run_id: int) -> float | None:
        """When ``run_id``'s deadline passes unless renewed (``time.monotonic()``), if it has
        one."""
        proven = self._proven.get(run_id)
        return None if proven is None else proven + self.length

    def expires_at(self) -> float | None:
        if not self._proven:
            return None
        return min(self._proven.values()) + self.length

    def _rearm(self) -> None:
        expires = self.expires_at()
        if self._timer is not None:
            if expires is not None and self._timer.when() == expires:
                return
            self._timer.cancel()
            self._timer = None
        if expires is not None:
            self._timer = asyncio.get_running_loop().call_at(expires, self._check)

    def _check(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        expired = [run for run, proven in self._proven.items() if proven + self.length <= now]
        for run_id in expired:
            del self._proven[run_id]
        self._rearm()
        if expired:
            self._on_expiry(expired)
