"""Whether the backend answers: the one voice in the log that says so.

Every part of the engine that calls the backend tells :class:`BackendHealth` how the call
went. The first failure is one WARNING with its reason; while the backend stays unavailable a
reminder follows every :data:`REMIND_EVERY`; one INFO says when a call got its answer again
(a statement ran, not merely a connection opened). An error that is not the backend being
unavailable (a bug, a statement the server refused) is an ERROR with its traceback, once for
each kind of error until the backend answers again.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta

from replicron._schedule.durations import duration_text

from .observe import Observer
from .retries import RETRY_UNREACHABLE

__all__ = ["REMIND_EVERY", "BackendHealth"]

#: How often the log says again that the backend is still unavailable.
REMIND_EVERY = timedelta(seconds=60)
_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the backend could not be reached or could not write now (a lost
    connection, a timeout, a locked or full disk) rather than that something is wrong."""
    return isinstance(exc, OSError | sqlite3.OperationalError)


def _reason(exc: BaseException) -> str:
    # One line: libpq, say, breaks its messages ("...refused\n\tIs the server running...").
    return " ".join(str(exc).split()) or type(exc).__name__


def _since(delta: timedelta) -> str:
    return duration_text(timedelta(seconds=round(delta.total_seconds(), 1)))


class BackendHealth:
    def __init__(self, observer: Observer, now: Callable[[], datetime]) -> None:
        self._observer, self._now = observer, now
        self._down_since: datetime | None = None
        self._reminded_at: datetime | None = None
        self._reason = ""
        #: The unexpected errors logged with their traceback since the backend last answered.
        self._told: set[tuple[type[BaseException], str]] = set()

    @property
    def available(self) -> bool:
        """Whether the last call that reached a verdict got its answer."""
        return self._down_since is None

    def failed(self, exc: BaseException, doing: str) -> None:
        """A call to the backend failed with ``exc`` while ``doing`` something."""
        now = self._now()
        self._reason = f"{doing}: {_reason(exc)}"
        if not is_outage(exc):
            told = (type(exc), str(exc))
            if told not in self._told:
                self._told.add(told)
                self._observer.log(
                    _ERROR, "lock_error", f"backend failed ({doing}): {exc!r}", exc_info=exc
                )
        if self._down_since is None:
            self._down_since = self._reminded_at = now
            if is_outage(exc):
                self._observer.log(
                    _WARNING, "backend_unavailable", f"backend unavailable ({doing}): "
                    f"{_reason(exc)}; "
                    f"trying again every {RETRY_UNREACHABLE:g} s: the ticks that fall due "
                    "meanwhile are handled once it answers",
                )  # fmt: skip
            return
        assert self._reminded_at is not None
        if now - self._reminded_at >= REMIND_EVERY:
            self._reminded_at = now
            self._observer.log(
                _WARNING, "backend_unavailable", f"backend still unavailable after "
                f"{_since(now - self._down_since)} ({self._reason})",
            )  # fmt: skip

    def answered(self) -> None:
        """A call to the backend got its answer: a statement ran."""
        if self._down_since is None:
            return
        down_for = self._now() - self._down_since
        self._down_since = self._reminded_at = None
        self._told.clear()
        self._observer.log(
            _INFO, "backend_available", f"backend available again after {_since(down_for)}"
        )
