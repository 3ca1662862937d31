"""Long-lived worker threads draining one shared queue of runs.

A ``loop.run_in_executor`` per run costs tens of microseconds of CPU, and waking every
thread for a burst of short runs makes them fight over the GIL. Here the engine appends all
the runs of an instant to a deque at once and wakes one thread, which keeps taking runs until
the deque is empty. More threads are woken only when the awake ones are all stuck in a run
for longer than ``STUCK_AFTER`` (sleeping on I/O, say): :meth:`WorkerPool.supervise`, which
the engine calls every ``STUCK_AFTER`` while runs wait, decides that.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["STUCK_AFTER", "WorkerPool"]

T = TypeVar("T")
_WAKE, _STOP = True, False
#: A run this old (seconds) counts as blocking its thread: wake another one.
STUCK_AFTER = 0.001


class WorkerPool(Generic[T]):
    """``handler(item)`` for every submitted item, on ``size`` threads."""

    def __init__(self, size: int, name: str, handler: Callable[[T], None]) -> None:
        self.size = size
        self._handler = handler
        self._pending: collections.deque[T] = collections.deque()
        self._signals: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._awake: set[threading.Thread] = set()
        self._started: dict[threading.Thread, float] = {}  # thread -> start of its run
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def waiting(self) -> int:
        """Runs submitted and not yet taken by a thread."""
        return len(self._pending)

    def submit_many(self, items: Iterable[T]) -> None:
        """Handle each of ``items`` on a worker thread, in order of submission; the handler
        must not raise."""
        self._pending.extend(items)
        if not self._awake and self._pending:
            self._signals.put(_WAKE)

    def supervise(self) -> bool:
        """Wake one more thread for every awake one stuck in a long run while runs wait.
        Returns whether runs are still waiting (call again after ``STUCK_AFTER``)."""
        if not self._pending:
            return False
        now = time.monotonic()
        free = len(self._awake) - sum(
            1 for since in list(self._started.values()) if now - since > STUCK_AFTER
        )
        asleep = self.size - len(self._awake)
        for _ in range(min(asleep, max(0, 1 - free))):
            self._signals.put(_WAKE)
        return True

    def _work(self) -> None:
        get, pending, awake, started = self._signals.get, self._pending, self._awake, self._started
        handler, me = self._handler, threading.current_thread()
        while get() is _WAKE:
            awake.add(me)
            try:
                while True:
                    try:
                        item = pending.popleft()
                    except IndexError:
                        break
                    started[me] = time.monotonic()
                    try:
                        handler(item)
                    finally:
                        started.pop(me, None)
            finally:
                awake.discard(me)
            if pending and not awake:  # work arrived as this thread was leaving
                self._signals.put(_WAKE)

    def stop(self, timeout: float | None) -> list[threading.Thread]:
        """Ask every thread to finish; wait up to ``timeout`` seconds.

        Returns the threads still running a task (one that ignores cancellation); they are
        daemon threads and do not keep the process alive. Idle threads exit on their own.
        """
        for _ in self._threads:
            self._signals.put(_STOP)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [t for t in self._threads if t.is_alive() and t in self._started]
