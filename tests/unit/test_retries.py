"""The ticks the engine comes back to, without an engine: pure bookkeeping."""

from __future__ import annotations

from datetime import timedelta

from replicron._engine.planner import Tick
from replicron._engine.retries import RETRY_EARLY, RETRY_UNREACHABLE, Retries
from tests.helpers import z

T0 = z(2026, 5, 1, 12)
S = timedelta(seconds=1)


def test_failed_ticks_are_kept_as_one_range_per_job_and_taken_once() -> None:
    retries = Retries()
    assert not retries.unhandled
    retries.unhandle([Tick("a", T0 + 2 * S), Tick("b", T0)], T0 + 2 * S)
    retries.unhandle([Tick("a", T0), Tick("a", T0 + 5 * S)], T0 + 5 * S)
    assert retries.unhandled
    assert retries.take_unhandled() == {"a": (T0, T0 + 5 * S), "b": (T0, T0)}
    assert not retries.unhandled
    assert retries.take_unhandled() == {}


def test_the_engine_wakes_for_the_earliest_retry_until_a_step_tries_again() -> None:
    retries = Retries()
    planned = T0 + 10 * S
    assert retries.wake_at(planned) == planned
    assert retries.wake_at(None) is None
    retries.unhandle([Tick("a", T0)], T0)
    backend_retry = T0 + timedelta(seconds=RETRY_UNREACHABLE)
    assert retries.wake_at(planned) == backend_retry
    retries.early(Tick("b", T0), T0)
    assert retries.wake_at(planned) == T0 + timedelta(seconds=RETRY_EARLY)
    assert retries.early_due(T0) == []
    assert retries.early_due(T0 + timedelta(seconds=RETRY_EARLY)) == [Tick("b", T0)]
    assert retries.wake_at(planned) == backend_retry
    retries.new_step()
    assert retries.wake_at(planned) == planned
