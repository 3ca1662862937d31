"""Tasks the engine starts without awaiting them: outcome writes, async listener calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Background"]


class Background:
    """Keeps the engine's background tasks referenced until they end (the loop holds tasks
    only weakly), tells ``on_done`` as each ends, and lets shutdown wait for the rest."""

    def __init__(self, on_done: Callable[[], None]) -> None:
        self._on_done = on_done
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def spawn(self, awaitable: Awaitable[Any]) -> None:
        assert self._loop is not None
        task: asyncio.Task[Any] = asyncio.ensure_future(awaitable, loop=self._loop)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._on_done()

    async def wait(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
