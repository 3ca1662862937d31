"""The embedded backend's own thread: SQLite calls and file locks block (a write waits up to
``busy_timeout`` for another process's transaction), so they run there, one at a time and in
the order they were made, never on the caller's event loop.

A caller cancelled meanwhile is let go at once; what its call took is let go of too (see
:meth:`CallThread.call`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

__all__ = ["CallThread", "OnThread"]

#: The backend's logger: its records keep the name they are filtered and shown by.
logger = logging.getLogger("replicron.backends.embedded")

_T = TypeVar("_T")


class OnThread(Protocol):
    """How a part of the backend has ``work(*args)`` run on the backend's thread (the
    backend's own call, refused while it is not open)."""

    async def __call__(self, work: Callable[..., _T], *args: Any) -> _T: ...


class CallThread:
    """A thread of one backend handle (of replica ``replica``) for its blocking calls, from
    its opening to its :meth:`end`."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"replicron-embedded-{replica}")
        self._ended = False  # set on the thread: the last call ran, nothing is given back now

    async def call(
        self, work: Callable[..., _T], *args: Any, give_back: Callable[[_T], None] | None = None
    ) -> _T:
        """``work(*args)`` on the thread. Its transaction ends whole (committed, or rolled back
        with the locks it took) whatever happens to the caller.

        If the caller is cancelled, a call without ``give_back`` (recording outcomes) still
        runs to its end. One with ``give_back`` (claiming, locking) is dropped if it has not
        begun; if it has, it runs to its end and then ``give_back`` lets go of what it took,
        which the caller never heard of: nobody would run its ticks or drop their locks.
        """
        call = self._pool.submit(work, *args)
        if give_back is None:
            return await _complete(call)
        try:
            return await asyncio.wrap_future(call)
        except asyncio.CancelledError:
            if not call.cancel():  # it has begun (or ended): it is given back right after
                with contextlib.suppress(RuntimeError):  # ended meanwhile: the last call did it
                    self._pool.submit(self._give_back, call, give_back)
            raise

    async def end(self, last: Callable[[], None]) -> None:
        """Run ``last`` behind the calls under way (it lets go of whatever they took), then
        end the thread. If the caller is cancelled, ``last`` still runs, and the thread ends
        after it."""
        ending = self._pool.submit(self._last, last)
        try:
            await _complete(ending)
        finally:
            # Joined once its last call is done (at once, then).
            self._pool.shutdown(wait=ending.done())

    def end_behind(self, last: Callable[[], None]) -> None:
        """Run ``last`` behind the calls under way and end the thread then, without waiting."""
        self._pool.submit(self._last, last)
        self._pool.shutdown(wait=False)

    def _last(self, last: Callable[[], None]) -> None:
        try:
            last()
        finally:
            self._ended = True

    def _give_back(self, call: Future[_T], give_back: Callable[[_T], None]) -> None:
        if self._ended or call.cancelled() or call.exception() is not None:
            return  # ended (the last call let go of everything), or it took nothing
        try:
            give_back(call.result())
        except Exception:  # what is left open is recorded abandoned at close
            logger.exception(
                "could not let go of what a cancelled call took",
                extra={"event": "lock_error", "replica": self.replica},
            )


async def _complete(call: Future[_T]) -> _T:
    """Wait for a call that is not dropped when its caller is cancelled: the caller stops
    waiting, the call runs to its end (an error it ends with is logged there, unseen)."""
    waiter = asyncio.wrap_future(call)
    try:
        return await asyncio.shield(waiter)
    except asyncio.CancelledError:
        waiter.add_done_callback(_log_unseen)
        raise


def _log_unseen(waiter: asyncio.Future[Any]) -> None:
    if not waiter.cancelled() and waiter.exception() is not None:
        logger.error(
            "a call whose caller was cancelled failed",
            exc_info=waiter.exception(),
            extra={"event": "lock_error"},
        )
