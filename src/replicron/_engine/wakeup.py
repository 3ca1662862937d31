"""A wake-up of the loop asked for from any thread, once for any number of asks."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Wakeup"]


class Wakeup:
    """Sets an :class:`asyncio.Event` on its loop from any thread. Until the loop has set
    it, further asks do nothing: a burst of changes (jobs added in bulk, runs ending)
    wakes the loop once, not once per change."""

    def __init__(self) -> None:
        #: Asked for, and not yet delivered on the loop.
        self.pending = False

    def __call__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        if self.pending or loop.is_closed():
            return
        self.pending = True
        with contextlib.suppress(RuntimeError):  # loop closed in between
            loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: asyncio.Event) -> None:
        self.pending = False
        event.set()
