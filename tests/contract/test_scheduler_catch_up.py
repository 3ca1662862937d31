"""catch_up="all" on every backend: a replica stopped in the middle of a catch-up backlog
records each tick it will not run missed, so every tick of the gap ends with exactly one
record, in the ledger and as told to the listeners. Two schedulers one after the other on
one store, with the defaults a user gets, on one FakeClock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest

from replicron import Outcome, Scheduler, current_run, every
from replicron.testing import FakeClock
from tests.contract.conftest import STORES, MemoryStore, Store
from tests.helpers import Gate, Recorder, step, z

SECOND = timedelta(seconds=1)
GAP = timedelta(minutes=2)
FIRST_TICK = z(2026, 1, 1) + SECOND


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as made:
        yield made


def test_a_replica_stopped_mid_backlog_records_each_tick_it_will_not_run(store: Store) -> None:
    clock = FakeClock(FIRST_TICK - SECOND)
    recorder = Recorder()
    with Scheduler(clock=clock, backend=store.new_handle(), listeners=[recorder]) as first:
        first.add_job(every(seconds=1), lambda: None, name="fast")
        step(clock, FIRST_TICK)
        recorder.wait_count("after_success", 1)
    clock.set(FIRST_TICK + GAP)  # no replica was up for the 120 ticks after the first

    gate = Gate()
    gate.release.set()

    def until_told_to_stop() -> None:
        gate()
        current_run().cancelled.wait(10)

    second = Scheduler(clock=clock, backend=store.new_handle(), listeners=[recorder])
    second.add_job(every(seconds=1), until_told_to_stop, name="fast", catch_up="all")
    second.start()
    gate.wait_started(1)  # the backlog's first tick runs, 119 wait behind it
    second.shutdown(wait=False)

    gap = [FIRST_TICK + k * SECOND for k in range(GAP // SECOND + 1)]
    told = Counter(tick for tick, _ in recorder.outcomes("fast"))
    assert [tick for tick in gap if told[tick] != 1] == []
    waited = {tick: outcome for tick, outcome in recorder.outcomes("fast") if tick > gap[1]}
    assert set(waited.values()) == {Outcome.MISSED}
    if not isinstance(store, MemoryStore):  # the memory store keeps the latest outcomes only
        recorded = store.recorded("fast")
        assert [tick for tick in gap if tick not in recorded] == []
        assert {recorded[tick].outcome for tick in waited} == {"missed"}
