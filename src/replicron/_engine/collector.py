"""Optionally keeping Python's automatic garbage collection out of the start of an instant's
runs (``Scheduler(defer_gc=True)``; off by default).

A full collection pass stops every thread for as long as scanning every tracked object takes:
15 ms or so with 30,000 objects on a small VM, far longer in a large service. Landing while an
instant's runs are being handed out, it delays every run not yet started by that much. With
``defer_gc=True``, once the backend has answered an instant's claims, the scheduler holds
automatic collection back until every run has begun, or :data:`HOLD_LIMIT` seconds at most:
whatever collection fell due meanwhile then runs. Nothing is collected more often and nothing
is skipped; a collection is only moved, by at most :data:`HOLD_LIMIT`.

The hold raises the first generation's threshold out of reach (``gc.set_threshold``) rather
than calling ``gc.disable()``, so an application's own ``gc.disable()``/``gc.enable()`` are
never overridden, before, during or after a hold. The thresholds are put back only if they
are still the held ones: an application that set its own meanwhile keeps them. Holds nest
across the schedulers of a process. A process forked during a hold gets its thresholds back
in the child, where nothing would release the hold (the fork hook is registered with the
first hold, not on import).
"""

from __future__ import annotations

import gc
import os
import threading

__all__ = ["HELD_THRESHOLD", "HOLD_LIMIT", "CollectorHold", "holding"]

#: Seconds a hold may last: runs that take long to start (a burst waiting for busy threads)
#: must not keep cyclic garbage around for long.
HOLD_LIMIT = 0.1
#: The first generation's threshold while held: no burst allocates that many objects.
HELD_THRESHOLD = 1 << 30

_lock = threading.Lock()
_holds = 0
_saved: tuple[int, ...] = ()  # the thresholds before the first hold
_generation = 0  # a forked child starts a new one: holds taken before the fork are void
_fork_hook = False


def holding() -> bool:
    """Whether automatic collection is held back now (by any scheduler of the process)."""
    return gc.get_threshold()[0] == HELD_THRESHOLD


def _hold() -> int:
    global _holds, _saved, _fork_hook
    with _lock:
        if not _fork_hook:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook = True
        if _holds == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(HELD_THRESHOLD, *_saved[1:])
        _holds += 1
        return _generation


def _put_back() -> None:
    """Restore the thresholds saved by the first hold, unless changed since."""
    if gc.get_threshold() == (HELD_THRESHOLD, *_saved[1:]):
        gc.set_threshold(*_saved)


def _release(generation: int) -> None:
    global _holds
    with _lock:
        if generation != _generation:
            return
        _holds -= 1
        if _holds == 0:
            _put_back()


def _after_fork_in_child() -> None:
    # Only the forking thread lives on in the child: nobody there will release a hold.
    global _lock, _holds, _generation
    _lock = threading.Lock()
    if _holds:
        _put_back()
    _holds = 0
    _generation += 1


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
