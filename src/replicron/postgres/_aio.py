"""Small asyncio helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["shielded"]

T = TypeVar("T")


async def shielded(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the caller is cancelled meanwhile; the
    cancellation is re-raised afterwards (cleanup such as an unlock must not be cut short)."""
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
