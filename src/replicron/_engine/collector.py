"""Keeping Python's automatic garbage collection out of the start of an instant's runs.

A full collection pass stops every thread for as long as scanning every tracked object takes:
15 ms or so with 30,000 objects on a small VM, far longer in a large service. Landing while an
instant's runs are being handed out, it delays every run not yet started by that much, and a
busy scheduler's own allocations bring one about every few seconds. So while a scheduler
starts an instant's runs it holds the automatic collector back (``gc.disable()``), and lets it
go once every run has begun, or after :data:`HOLD_LIMIT` seconds at most: whatever collection
fell due meanwhile then runs. Nothing is collected more often and nothing is skipped; a
collection is only moved, by at most :data:`HOLD_LIMIT`.

Holds nest, across the schedulers of a process. The collector is enabled again only if it was
enabled when the first hold began, so a process that turned it off keeps it off; a process
forked during a hold enables it again in the child, where nothing would release the hold.
"""

from __future__ import annotations

import gc
import os
import threading

__all__ = ["HOLD_LIMIT", "CollectorHold"]

#: Seconds a hold may last: runs that take long to start (a burst waiting for busy threads)
#: must not keep cyclic garbage around for long.
HOLD_LIMIT = 0.1

_lock = threading.Lock()
_holds = 0
_enable_after = False
_generation = 0  # a forked child starts a new one: holds taken before the fork are void


def _hold() -> int:
    global _holds, _enable_after
    with _lock:
        if _holds == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _holds += 1
        return _generation


def _release(generation: int) -> None:
    global _holds
    with _lock:
        if generation != _generation:
            return
        _holds -= 1
        if _holds == 0 and _enable_after:
            gc.enable()


def _after_fork_in_child() -> None:
    # Only the forking thread lives on in the child: nobody there will release a hold.
    global _lock, _holds, _generation
    _lock = threading.Lock()
    if _holds and _enable_after:
        gc.enable()
    _holds = 0
    _generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class CollectorHold:
    """One scheduler's hold on the collector: taken at most once at a time, released once."""

    __slots__ = ("_generation", "enabled", "held")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.held = False
        self._generation = -1

    def take(self) -> bool:
        """Hold the collector back unless this hold is off or taken; True if it was taken
        now."""
        if not self.enabled or self.held:
            return False
        self._generation = _hold()
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            _release(self._generation)
