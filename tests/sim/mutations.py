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
from replicron._engine.runs import RunExecutor
from replicron.postgres._bounds import _rows
from replicron.postgres._housekeeping import Housekeeper
from replicron.postgres._pooled import PooledSession
from replicron.postgres._reference import STATEMENTS
from replicron.postgres._reference.database import Database
from replicron.postgres._writes import OutcomeWrites

__all__ = ["MUTATIONS", "mutated"]


def _rewritten(function: Any, old: str, new: str) -> Any:
    """``function`` as its source reads with ``old`` (which must be there) made ``new``:
    the fix taken out again, line for line."""
    source = textwrap.dedent(inspect.getsource(function))
    if old not in source:
        raise AssertionError(f"{function.__qualname__} no longer reads {old!r}")
    namespace = dict(vars(sys.modules[function.__module__]))
    exec(compile(source.replace(old, new), inspect.getfile(function), "exec"), namespace)
    return namespace[function.__name__]


@contextlib.contextmanager
def _edited(owner: type, name: str, old: str, new: str) -> Iterator[None]:
    """``owner.name`` rewritten (see ``_rewritten``)."""
    with mock.patch.object(owner, name, _rewritten(owner.__dict__[name], old, new)):
        yield


@contextlib.contextmanager
def _statement_edited(name: str, old: str, new: str) -> Iterator[None]:
    """The reference ledger's statement ``name`` rewritten: the SQL as it read before."""
    function = STATEMENTS[name]
    with mock.patch.dict(STATEMENTS, {name: _rewritten(function, old, new)}):
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


# ---- gaps the simulator found, since closed ---------------------------------------------


def _written_off_runs_not_counted() -> contextlib.AbstractContextManager[None]:
    """``max_runs`` counts an open row whose lease ran out only once a janitor writes it off:
    a run whose replica died does not count meanwhile, and a claim may start one past the
    limit (migration 0010)."""
    return _edited(
        Database,
        "_written_off_but_in_name",
        "if row.lease_until is not None and row.lease_until < self.now:",
        "if False:",
    )


@contextlib.contextmanager
def _ticks_before_the_last_run_unrecorded() -> Iterator[None]:
    """A limited job's ticks missed before its last run are refused as past the limit: they
    are left without a record."""
    with mock.patch.object(Database, "last_run", return_value=None):
        yield


def _term_won_mid_step_claims_at_once() -> contextlib.AbstractContextManager[None]:
    """A leader term won while a step waits on its statements counts at once: the tick is
    claimed before the catch-up, which then misses the ticks that fell due without a
    leader."""
    return _edited(
        Leadership, "_leads_this_step", "return self._was_leading and self.leading()",
        "return self.leading()",
    )  # fmt: skip


def _run_cut_off_before_its_task_began_left_open() -> contextlib.AbstractContextManager[None]:
    """An async run whose task is cancelled before its first step is never recorded: its row
    stays open, heartbeated, for as long as its replica lives."""
    return _edited(
        RunExecutor,
        "start",
        "run.task.add_done_callback(functools.partial(self._cut_off_before_it_began, run))",
        "pass",
    )


def _lapsed_lease_renewed() -> contextlib.AbstractContextManager[None]:
    """A heartbeat renews a run's row whose lease ran out (its holder woke before a janitor
    came): the row is fresh again, so max_runs stops counting it."""
    return _statement_edited(
        "lease_heartbeat", "and _lease_end(row, stale_after) >= now", "and True"
    )


def _first_tick_without_a_replica_lost() -> contextlib.AbstractContextManager[None]:
    """A registered job with no tick recorded has nothing to catch up from: a first tick
    that fell due while every replica was down is neither run nor recorded."""
    return _statement_edited("last_ticks", "        if firsts:\n", "        if False:\n")


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "release_loses_outcomes": _release_loses_outcomes,
    "failed_claim_drops_ticks": _failed_claim_drops_ticks,
    "takeover_drops_ticks_let_go": _takeover_drops_ticks_let_go,
    "spreader_keeps_a_tick_twice": _spreader_keeps_a_tick_twice,
    "claims_beside_the_other_mode_after_a_freeze": _claims_beside_the_other_mode_after_a_freeze,
    "statements_left_on_the_server": _statements_left_on_the_server,
    "written_off_runs_not_counted": _written_off_runs_not_counted,
    "ticks_before_the_last_run_unrecorded": _ticks_before_the_last_run_unrecorded,
    "term_won_mid_step_claims_at_once": _term_won_mid_step_claims_at_once,
    "run_cut_off_before_its_task_began_left_open": _run_cut_off_before_its_task_began_left_open,
    "lapsed_lease_renewed": _lapsed_lease_renewed,
    "first_tick_without_a_replica_lost": _first_tick_without_a_replica_lost,
}


@contextlib.contextmanager
def mutated(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    with MUTATIONS[name]():
        yield
