"""The backend's named statements (``sql/queries.sql``), run on its session one at a time."""

from __future__ import annotations

import time
from typing import Any

from ._session import BackendUnavailableError, LockSession, RoundTrip, TransactionPoolerError
from ._sql import queries

__all__ = ["Statements"]


class Statements:
    """Runs the backend's statements by name in its namespace, on the session ``open`` gives
    it; refused for good once ``refuse`` is told that coordination through it cannot be
    trusted."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.session: LockSession | None = None
        self._refusal: TransactionPoolerError | None = None
        self._queries = queries()

    async def fetch(self, name: str, *, retry: bool = False, **params: Any) -> list[Any]:
        if self._refusal is not None:
            raise self._refusal
        if self.session is None:
            raise BackendUnavailableError("the backend is not open")
        params.setdefault("namespace", self.namespace)
        return await self.session.fetch(self._queries[name], params, retry=retry)

    def invalidate(self) -> None:
        """Give the session up as soon as no statement is using it."""
        if self.session is not None:
            self.session.invalidate()

    def refuse(self, refusal: TransactionPoolerError) -> None:
        """Give the session up, and refuse every later statement with ``refusal``."""
        self.invalidate()
        self._refusal = refusal

    def round_trip(self) -> RoundTrip:
        """When the last statement was sent and answered."""
        assert self.session is not None
        assert self.session.last_round_trip is not None
        return self.session.last_round_trip

    def sent_at(self) -> float:
        """When the last statement was sent (monotonic: the event loop's clock)."""
        return self.round_trip().sent_mono

    def unreachable(self, within: float) -> bool:
        """Whether the server could not be reached less than ``within`` seconds ago (or
        there is no session): one more try now would only wait as long again."""
        session = self.session
        if session is None:
            return True
        failed = session.connect_failed_at
        return failed is not None and time.monotonic() - failed < within
