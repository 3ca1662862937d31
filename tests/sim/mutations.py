"""Faults fixed in earlier rounds, put back one at a time: the simulator must find each with
its generic fault generator (``bash scripts/simulate --mutation NAME``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from unittest import mock

from replicron._engine.retries import Retries
from replicron.postgres._writes import OutcomeWrites

__all__ = ["MUTATIONS", "mutated"]


@contextlib.contextmanager
def _release_loses_outcomes() -> Iterator[None]:
    """A release whose statement failed forgets the outcomes it carried (they were to be kept
    and written again): the runs' rows stay open until a janitor calls them abandoned."""
    write = OutcomeWrites._write_outcomes

    async def forgetting(self: OutcomeWrites, releases: Any) -> None:
        try:
            await write(self, releases)
        except BaseException:
            self.unwritten = []
            raise

    with mock.patch.object(OutcomeWrites, "_write_outcomes", forgetting):
        yield


@contextlib.contextmanager
def _failed_claim_drops_ticks() -> Iterator[None]:
    """The ticks of a claim that failed are dropped, not run or recorded once the backend
    answers again."""

    def forget(self: Retries, ticks: list[Any], now: datetime) -> None:
        self.retry_backend(now)

    with mock.patch.object(Retries, "unhandle", forget):
        yield


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "release_loses_outcomes": _release_loses_outcomes,
    "failed_claim_drops_ticks": _failed_claim_drops_ticks,
}


@contextlib.contextmanager
def mutated(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    with MUTATIONS[name]():
        yield
