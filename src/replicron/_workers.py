"""Long-lived worker threads fed by one queue: the cheap way to hand sync runs off the loop.

A ``loop.run_in_executor`` per run costs tens of microseconds of CPU; a ``SimpleQueue``
feeding threads that live as long as the scheduler costs a few.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

__all__ = ["WorkerPool"]

_STOP = None


class WorkerPool:
    def __init__(self, size: int, name: str) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._busy: set[threading.Thread] = set()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        """Run ``work`` on a worker thread; it must not raise (wrap it)."""
        self._queue.put(work)

    def _work(self) -> None:
        get, busy, me = self._queue.get, self._busy, threading.current_thread()
        while (work := get()) is not _STOP:
            busy.add(me)
            try:
                work()
            finally:
                busy.discard(me)

    def stop(self, timeout: float | None) -> list[threading.Thread]:
        """Ask every thread to finish after the work already queued; wait up to ``timeout``.

        Returns the threads still running a task (one that ignores cancellation); they are
        daemon threads and do not keep the process alive. Idle threads exit on their own.
        """
        for _ in self._threads:
            self._queue.put(_STOP)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [thread for thread in self._threads if thread.is_alive() and thread in self._busy]
