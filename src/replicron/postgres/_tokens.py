"""Claim tokens remembered across a failed statement.

A claim (or a miss record) whose answer was lost with the connection may have been committed.
Asked again with the same token per tick, the statement recognises the rows its first try
inserted as this replica's; a fresh token would find them "taken" and leave them open.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from ._session import BackendUnavailableError

__all__ = ["ClaimTokens", "Tick"]

Tick = tuple[str, datetime]
#: Ticks remembered at most (the oldest are dropped: a janitor records their rows in the end).
MAX_REMEMBERED = 100_000


class ClaimTokens:
    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._by_tick: dict[Tick, uuid.UUID] = {}
        self._limit = limit

    def __bool__(self) -> bool:
        return bool(self._by_tick)

    def __contains__(self, tick: object) -> bool:
        """Whether a statement about ``tick`` failed and its rows may exist under our token."""
        return tick in self._by_tick

    def for_ticks(self, ticks: Sequence[Tick]) -> list[uuid.UUID]:
        """Each tick's remembered token, or one fresh token for the others."""
        fresh = uuid.uuid4()
        return [self._by_tick.get(tick, fresh) for tick in ticks]

    @contextmanager
    def attempt(self, ticks: Sequence[Tick]) -> Iterator[list[uuid.UUID]]:
        """The tokens for a statement writing ``ticks``: remembered if it fails (it may have
        written rows), forgotten once it answers."""
        tokens = self.for_ticks(ticks)
        try:
            yield tokens
        except (BackendUnavailableError, asyncio.CancelledError):
            self.remember(ticks, tokens)
            raise
        self.forget(ticks)

    def remember(self, ticks: Sequence[Tick], tokens: Sequence[uuid.UUID]) -> None:
        """The statement failed: its rows may exist under these tokens."""
        for tick, token in zip(ticks, tokens, strict=True):
            self._by_tick.setdefault(tick, token)
        while len(self._by_tick) > self._limit:
            del self._by_tick[next(iter(self._by_tick))]

    def forget(self, ticks: Sequence[Tick]) -> None:
        """The statement answered: what it found settles these ticks."""
        for tick in ticks:
            self._by_tick.pop(tick, None)

    def within(self, job: str, first: datetime, last: datetime) -> list[datetime]:
        """The remembered ticks of ``job`` from ``first`` through ``last``."""
        return sorted(tick for name, tick in self._by_tick if name == job and first <= tick <= last)

    def tokens(self) -> list[uuid.UUID]:
        return sorted(set(self._by_tick.values()), key=str)

    def jobs(self) -> list[str]:
        return sorted({job for job, _ in self._by_tick})

    def clear(self) -> None:
        self._by_tick.clear()
