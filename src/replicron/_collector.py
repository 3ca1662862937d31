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
enabled when the first hold began, so a process that turned it off keeps it off.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["HOLD_LIMIT", "CollectorHold"]

#: Seconds a hold may last: runs that take long to start (a burst waiting for busy threads)
#: must not keep cyclic garbage around for long.
HOLD_LIMIT = 0.1

_lock = threading.Lock()
_holds = 0
_enable_after = False


def _hold() -> None:
    global _holds, _enable_after
    with _lock:
        if _holds == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _holds += 1


def _release() -> None:
    global _holds
    with _lock:
        _holds -= 1
        if _holds == 0 and _enable_after:
            gc.enable()


class CollectorHold:
    """One scheduler's hold on the collector: taken at most once at a time, released once."""

    __slots__ = ("enabled", "held")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.held = False

    def take(self) -> bool:
        """Hold the collector back unless this hold is off or taken; True if it was taken
        now."""
        if not self.enabled or self.held:
            return False
        _hold()
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            _release()
