"""Long-lived worker threads draining one shared queue of runs.

A ``loop.run_in_executor`` per run costs tens of microseconds of CPU, and waking every
thread for a burst of short runs makes them fight over the GIL. Here the engine appends all
the runs of an instant to a deque at once and wakes one thread, which keeps taking runs until
the deque is empty. Another thread is woken only when no run was taken for ``STUCK_AFTER``
while runs wait (the awake threads are stuck in long runs, sleeping on I/O, say):
:meth:`WorkerPool.supervise`, which the engine calls that often while runs wait, checks.
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
#: Seconds without progress, while runs wait, after which another thread is woken.
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
        self._taken = 0  # runs taken so far (a progress counter; exactness is not needed)
        self._seen = 0
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
        """While runs wait: if no thread took a run since the last call, the awake ones are
        stuck in long runs (or none is awake), so wake one more. Returns whether runs are
        still waiting (call again after ``STUCK_AFTER``)."""
        if not self._pending:
            self._seen = self._taken
            return False
        if self._taken == self._seen and len(self._awake) < self.size:
            self._signals.put(_WAKE)
        self._seen = self._taken
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
                    self._taken += 1
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
