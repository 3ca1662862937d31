"""Whether the backend answers: the one voice in the log that says so.

Every part of the engine that calls the backend tells :class:`BackendHealth` how the call
went, naming what it was doing. The first failure is one WARNING with its reason; while the
backend stays unavailable a reminder follows every :data:`REMIND_EVERY`; one INFO says when
it is back: each kind of call that failed and is tried again has got its answer (a statement
ran, not merely a connection opened), so that a backend answering some calls and not others
(a table locked, say) is not said to come and go. An error that is not the backend being
unavailable (a bug, a statement the server refused) is an ERROR with its traceback, once for
each kind of error until the backend is back. A backend that refuses to coordinate (it said
why itself) is no outage.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta

from replicron._schedule.durations import duration_text

from .observe import Observer
from .retries import RETRY_UNREACHABLE

__all__ = [
    "CATCHING_UP",
    "CLAIMING",
    "CLAIMING_MANUAL",
    "RECORDING_MISSED",
    "REMIND_EVERY",
    "BackendHealth",
    "is_outage",
]

#: How often the log says again that the backend is still unavailable.
REMIND_EVERY = timedelta(seconds=60)
#: What the engine does with the backend, where more than one part does it.
CLAIMING, CLAIMING_MANUAL = "claiming ticks", "claiming manual runs"
RECORDING_MISSED, CATCHING_UP = "recording ticks missed", "catching up"
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
    def __init__(
        self,
        observer: Observer,
        now: Callable[[], datetime],
        refusal: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._observer, self._now, self._refusal = observer, now, refusal
        self._down_since: datetime | None = None
        #: The kinds of call that failed and are tried again, not answered since: when each
        #: last failed (one not tried for a while is no longer tried: it holds nothing up).
        self._failing: dict[str, datetime] = {}
        self._reminded_at: datetime | None = None
        #: The first answer since the last failure: when the outage ended, as far as is known
        #: (the other kinds of call that failed may be tried again only seconds later).
        self._answered_at: datetime | None = None
        self._reason = ""
        #: The unexpected errors logged with their traceback since the backend last answered.
        self._told: set[tuple[type[BaseException], str]] = set()

    def failed(self, exc: BaseException, doing: str, *, retried: bool = True) -> None:
        """A call to the backend failed with ``exc`` while ``doing`` something; ``retried``:
        the same kind of call is made again (not a one-off, such as joining)."""
        if self._refusal() is not None:
            self._observer.log(logging.DEBUG, "lock_error", f"{doing}: {_reason(exc)}")
            return
        now = self._now()
        self._answered_at = None
        if retried:
            self._failing[doing] = now
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
                    _WARNING,
                    "backend_unavailable",
                    f"backend unavailable ({doing}): "
                    f"{_reason(exc)}; "
                    f"trying again every {RETRY_UNREACHABLE:g} s: the ticks that fall due "
                    "meanwhile are handled once it answers",
                )
            return
        assert self._reminded_at is not None
        if now - self._reminded_at >= REMIND_EVERY:
            self._reminded_at = now
            self._observer.log(
                _WARNING,
                "backend_unavailable",
                f"backend still unavailable after "
                f"{_since(now - self._down_since)} ({self._reason})",
            )

    def answered(self, doing: str) -> None:
        """A call to the backend, ``doing`` something, got its answer: a statement ran."""
        self._failing.pop(doing, None)
        if self._down_since is None:
            return
        now = self._now()
        if self._answered_at is None:
            self._answered_at = now
        if any(now - failed < REMIND_EVERY for failed in self._failing.values()):
            return
        self._failing.clear()
        down_for = self._answered_at - self._down_since
        self._down_since = self._reminded_at = self._answered_at = None
        self._told.clear()
        self._observer.log(
            _INFO, "backend_available", f"backend available again after {_since(down_for)}"
        )
