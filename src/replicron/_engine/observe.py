"""Logging and listener calls: every record carries job, tick and replica."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from replicron.events import Listener, RunEvent

__all__ = ["Observer"]


class Observer:
    """Sends run events to the log and to listeners; nothing here ever raises."""

    def __init__(
        self,
        logger: logging.Logger,
        replica_id: str,
        listeners: Sequence[Listener],
        spawn: Callable[[Awaitable[Any]], None],
    ) -> None:
        self.logger = logger
        self.replica_id = replica_id
        self.listeners = tuple(listeners)
        self._spawn = spawn

    def enabled(self, level: int) -> bool:
        return self.logger.isEnabledFor(level)

    def log(
        self,
        level: int,
        event: str,
        message: str,
        job: str | None = None,
        tick: datetime | None = None,
        run_id: int | None = None,
        exc_info: BaseException | None = None,
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return
        extra = {
            "event": event,
            "job": job,
            "tick": None if tick is None else tick.isoformat(),
            "replica": self.replica_id,
            "run_id": run_id,
        }
        where = "" if job is None else f"job {job!r}: "
        if job is not None and tick is not None:
            where = f"job {job!r} tick {extra['tick']}: "
        self.logger.log(level, "%s%s", where, message, extra=extra, exc_info=exc_info)

    def add(self, listener: Listener) -> None:
        # A new tuple each time: a notify under way goes on with the one it began with.
        if listener not in self.listeners:
            self.listeners = (*self.listeners, listener)

    def remove(self, listener: Listener) -> None:
        self.listeners = tuple(other for other in self.listeners if other is not listener)

    def notify(self, hook: str, event: Any) -> None:
        """Call ``hook`` of every listener with ``event`` (a RunEvent, a job name or a
        replica id, by hook)."""
        for listener in self.listeners:
            try:
                result = getattr(listener, hook)(event)
            except Exception as exc:
                self._listener_failed(hook, event, exc)
                continue
            if inspect.isawaitable(result):
                self._spawn(self._await_listener(result, hook, event))

    async def _await_listener(self, result: Awaitable[Any], hook: str, event: Any) -> None:
        try:
            await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._listener_failed(hook, event, exc)

    def _listener_failed(self, hook: str, event: Any, exc: Exception) -> None:
        job: str | None = None
        tick: datetime | None = None
        run_id: int | None = None
        if isinstance(event, RunEvent):
            job, tick, run_id = event.job, event.scheduled_at, event.run_id
        elif hook.startswith("on_job"):  # a job's name; other hooks get this replica's id
            job = event
        self.log(
            logging.ERROR,
            "listener_failed",
            f"listener {hook} raised {exc!r}",
            job,
            tick,
            run_id,
            exc_info=exc,
        )
