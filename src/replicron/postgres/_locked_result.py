"""What both flavours of ``locked_run`` share: the result, and which locks the callers of
this process hold on each connection."""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

__all__ = ["LockedRun", "ProcessHolds"]


class LockedRun(NamedTuple):
    """Whether the function ran (``False``: another holder had the lock) and its value."""

    ran: bool
    value: Any = None


class ProcessHolds:
    """The lock keys this process's callers hold, per connection. An advisory lock re-enters
    within its session, so callers sharing one connection would all get it: they exclude
    each other here first."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()

    def take(self, conn: Any, key: int) -> bool:
        with self._guard:
            keys = self._held.setdefault(conn, set())
            if key in keys:
                return False
            keys.add(key)
            return True

    def give_back(self, conn: Any, key: int) -> None:
        with self._guard:
            self._held.get(conn, set()).discard(key)
