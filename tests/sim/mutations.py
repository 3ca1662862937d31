"""Faults fixed in earlier rounds, put back one at a time: the simulator must find each with
its generic fault generator (``bash scripts/simulate --mutation NAME``)."""

from __future__ import annotations

import contextlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from unittest import mock

from replicron._engine.capacity import Spreader
from replicron._engine.leadership import Leadership
from replicron._engine.retries import Retries
from replicron.postgres._bounds import _rows
from replicron.postgres._housekeeping import Housekeeper
from replicron.postgres._pooled import PooledSession
from replicron.postgres._writes import OutcomeWrites

__all__ = ["MUTATIONS", "mutated"]


@contextlib.contextmanager
def _edited(owner: type, name: str, old: str, new: str) -> Iterator[None]:
    """``owner.name`` as its source reads with ``old`` (which must be there) made ``new``:
    the fix taken out again, line for line."""
    function = owner.__dict__[name]
    source = textwrap.dedent(inspect.getsource(function))
    if old not in source:
        raise AssertionError(f"{owner.__name__}.{name} no longer reads {old!r}")
    namespace = dict(vars(sys.modules[function.__module__]))
    exec(compile(source.replace(old, new), inspect.getfile(function), "exec"), namespace)
    with mock.patch.object(owner, name, namespace[name]):
        yield


def _takeover_drops_ticks_let_go() -> contextlib.AbstractContextManager[None]:
    """A standby taking the leader lease over does not claim the leader-mode ticks it let go
    ahead of their instant (claims are planned ahead): nobody records them."""
    return _edited(
        Leadership,
        "step",
        "immediate += [tick for tick in self._ahead if self.led(tick.job)]",
        "pass",
    )


def _spreader_keeps_a_tick_twice() -> contextlib.AbstractContextManager[None]:
    """A tick given twice to the spreader (due, and found by a starting replica's catch-up)
    is kept twice: the second counts as a newer tick replacing the first."""
    return _edited(Spreader, "split", "pending = list(dict.fromkeys(pending))", "pass")


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


@contextlib.contextmanager
def _claims_beside_the_other_mode_after_a_freeze() -> Iterator[None]:
    """A replica checks the namespace's modes when it joins only: back from a freeze or a
    partition past ``stale_after`` (the others counted it gone, and a replica of the other
    mode may have started meanwhile), it claims beside that replica."""
    with (
        _edited(
            Housekeeper,
            "admit",
            "if not self._admitted or time.monotonic() >= self._live_until:",
            "if not self._admitted:",
        ),
        _edited(
            Housekeeper,
            "heartbeat",
            "if time.monotonic() >= self._live_until:\n            self._admitted = False",
            "pass",
        ),
    ):
        yield


@contextlib.contextmanager
def _statements_left_on_the_server() -> Iterator[None]:
    """Row lease sends its statements without the server's own bounds for their transaction
    (it keeps no session settings, for a pooler's sake): a statement it gave up on waits on
    the server, behind a lock say, for as long as the lock is held, and then runs."""

    def unbounded(self: PooledSession, conn: Any, query: str, params: Any) -> Any:
        return _rows(conn, query, params)

    with mock.patch.object(PooledSession, "_statement", unbounded):
        yield


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "release_loses_outcomes": _release_loses_outcomes,
    "failed_claim_drops_ticks": _failed_claim_drops_ticks,
    "takeover_drops_ticks_let_go": _takeover_drops_ticks_let_go,
    "spreader_keeps_a_tick_twice": _spreader_keeps_a_tick_twice,
    "claims_beside_the_other_mode_after_a_freeze": _claims_beside_the_other_mode_after_a_freeze,
    "statements_left_on_the_server": _statements_left_on_the_server,
}


@contextlib.contextmanager
def mutated(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    with MUTATIONS[name]():
        yield
