"""Ticks the engine must come back to: those whose handling failed with the backend, and those
the backend said were not yet due by its clock. State only, no I/O: the engine asks it what is
due and when to wake."""

from __future__ import annotations

from datetime import datetime, timedelta

from .planner import Tick

__all__ = ["RETRY_EARLY", "RETRY_UNREACHABLE", "Retries"]

#: Seconds between tries to reach an unreachable backend again, and before asking again for a
#: tick the backend said was not yet due by its clock.
RETRY_UNREACHABLE = 1.0
RETRY_EARLY = 0.1


class Retries:
    def __init__(self) -> None:
        # job -> the first and last tick whose handling failed (all between are its ticks too:
        # the planner handed every one of them to a step that failed).
        self._unhandled: dict[str, tuple[datetime, datetime]] = {}
        self._early: list[tuple[datetime, Tick]] = []
        self._backend_retry: datetime | None = None

    @property
    def unhandled(self) -> bool:
        return bool(self._unhandled)

    def unhandle(self, ticks: list[Tick], now: datetime) -> None:
        """The backend failed with these ticks: to be run or recorded missed once it answers."""
        for job, tick in ticks:
            first, last = self._unhandled.get(job, (tick, tick))
            self._unhandled[job] = (min(first, tick), max(last, tick))
        self.retry_backend(now)

    def take_unhandled(self) -> dict[str, tuple[datetime, datetime]]:
        unhandled, self._unhandled = self._unhandled, {}
        return unhandled

    def retry_backend(self, now: datetime) -> None:
        retry = now + timedelta(seconds=RETRY_UNREACHABLE)
        if self._backend_retry is None or retry < self._backend_retry:
            self._backend_retry = retry

    def new_step(self) -> None:
        """A step begins: it tries the backend, so no earlier retry is still owed."""
        self._backend_retry = None

    def early(self, tick: Tick, now: datetime) -> None:
        """The backend's clock says the tick is not due yet: ask for it again shortly."""
        self._early.append((now + timedelta(seconds=RETRY_EARLY), tick))
        self._early.sort(key=lambda entry: entry[0])

    def early_due(self, now: datetime) -> list[Tick]:
        due = [tick for at, tick in self._early if at <= now]
        if due:
            self._early = [(at, tick) for at, tick in self._early if at > now]
        return due

    def wake_at(self, planned: datetime | None) -> datetime | None:
        """The earliest of ``planned`` and what these retries need."""
        for other in (self._early[0][0] if self._early else None, self._backend_retry):
            if other is not None and (planned is None or other < planned):
                planned = other
        return planned
