"""Long-lived worker threads draining one shared queue of runs.

A ``loop.run_in_executor`` per run costs tens of microseconds of CPU, and waking every
thread for a burst of short runs makes them fight over the GIL. Here the engine appends all
the runs of an instant to a deque at once and wakes one thread, which keeps taking runs until
the deque is empty. Another thread is woken only when the awake ones look stuck (in a long
run, or one sleeping on I/O) while runs wait: the engine calls :meth:`WorkerPool.supervise`
every ``STUCK_AFTER`` seconds while runs wait, and it checks.

A thread that was signalled but has not got the GIL yet counts as on its way: waking more
threads while the loop holds the GIL would only make them all compete for it once it is free.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["STUCK_AFTER", "WorkerPool", "needs_another_thread"]

T = TypeVar("T")
_WAKE, _STOP = True, False
#: Seconds without progress, while runs wait, after which another thread is woken.
STUCK_AFTER = 0.001
#: Weight of the latest run in the running mean of how long a run holds its thread.
_RUN_WEIGHT = 0.1


def needs_another_thread(
    run_starts: Sequence[float | None], signalled: int, size: int, progressed: bool, now: float
) -> bool:
    """Whether waiting runs need one more thread.

    ``run_starts`` has one entry per awake thread: when its current run started (monotonic
    seconds), or ``None`` between runs. ``signalled`` threads were woken and have not begun.
    ``progressed``: some thread took a run since the last check. A thread counts as stuck
    only if no run was taken meanwhile *and* its run is ``STUCK_AFTER`` old, since a thread
    waiting for the GIL (held by the loop, say) looks the same as one in a long run for a
    few milliseconds.
    """
    if progressed or signalled or len(run_starts) >= size:
        return False
    return all(start is not None and now - start >= STUCK_AFTER for start in run_starts)


class WorkerPool(Generic[T]):
    """``handler(item)`` for every submitted item, on ``size`` threads."""

    def __init__(self, size: int, name: str, handler: Callable[[T], None]) -> None:
        self.size = size
        self._handler = handler
        self._pending: collections.deque[T] = collections.deque()
        self._signals: queue.SimpleQueue[bool] = queue.SimpleQueue()
        # Guards who is awake and how many wake-ups are on their way, so that a submission
        # and a thread going back to sleep never both leave the waiting runs to the other.
        self._lock = threading.Lock()
        self._awake: set[threading.Thread] = set()
        self._signalled = 0
        self._started: dict[threading.Thread, float] = {}  # thread -> start of its run
        self._taken = 0  # runs taken so far (a progress counter; exactness is not needed)
        self._seen = 0
        #: How long a run holds its thread (seconds, a running mean; None before the first).
        #: Threads update it without a lock: a lost update only lags the mean.
        self.run_seconds: float | None = None
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
        pending = self._pending
        pending.extend(items)
        with self._lock:
            mean = self.run_seconds
            if mean is not None and mean >= STUCK_AFTER:
                # Runs this long would find every awake thread stuck anyway: the threads a
                # burst needs are woken at once, not one per STUCK_AFTER.
                wanted = min(len(pending), self.size) - len(self._awake) - self._signalled
                for _ in range(wanted):
                    self._signal()
            else:
                self._wake_one_unless_taken_care_of()

    def supervise(self) -> bool:
        """While runs wait: wake one more thread if the awake ones are stuck. Returns whether
        runs are still waiting (call again after ``STUCK_AFTER``)."""
        taken, progressed = self._taken, self._taken != self._seen
        self._seen = taken
        if not self._pending:
            return False
        with self._lock:
            starts = [self._started.get(thread) for thread in self._awake]
            now = time.monotonic()
            if needs_another_thread(starts, self._signalled, self.size, progressed, now):
                self._signal()
        return True

    def _signal(self) -> None:
        self._signalled += 1
        self._signals.put(_WAKE)

    def _wake_one_unless_taken_care_of(self) -> None:
        """With the lock held: runs wait, and no thread is awake or on its way to them."""
        if self._pending and not self._awake and not self._signalled:
            self._signal()

    def _work(self) -> None:
        get, pending, started, lock = self._signals.get, self._pending, self._started, self._lock
        handler, me, monotonic = self._handler, threading.current_thread(), time.monotonic
        while get() is _WAKE:
            with lock:
                self._signalled -= 1
                self._awake.add(me)
            try:
                while True:
                    try:
                        item = pending.popleft()
                    except IndexError:
                        break
                    self._taken += 1
                    started[me] = began = monotonic()
                    try:
                        handler(item)
                    finally:
                        del started[me]
                        del item  # not kept alive while the thread sleeps
                        held, mean = monotonic() - began, self.run_seconds
                        self.run_seconds = (
                            held if mean is None else mean + _RUN_WEIGHT * (held - mean)
                        )
            finally:
                with lock:
                    self._awake.discard(me)
                    self._wake_one_unless_taken_care_of()  # work came as this one was leaving

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
