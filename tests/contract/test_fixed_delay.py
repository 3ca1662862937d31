"""Fixed-delay jobs (``after``) on replicas sharing a backend, on every backend
(``conftest.STORES``), driven by one FakeClock: each tick is the last finish the ledger
recorded plus the delay, claimed once, never run while the last run goes on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from replicron import Outcome, after
from replicron.backends.base import LastFinish, LastFinishes
from tests.contract.conftest import STORES, Backends, Store, replica
from tests.helpers import Recorder, Stepped, z

START = z(2026, 1, 1)  # on the grid of every(5 s): the first tick of a job is START + 5 s


def s(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as made:
        yield made


class Replicas:
    """Three schedulers on one store and one FakeClock; the job's runs block until the test
    lets each finish, so that their finish times are the ones the test sets."""

    def __init__(self, store: Store) -> None:
        from replicron.testing import FakeClock

        self.store = store
        self.clock = FakeClock(s(1))
        self.recorder = Recorder()
        self.schedulers = [replica(store, i, self.clock, self.recorder) for i in range(3)]
        self.runs = Stepped()
        self.task = self.runs

    def idle(self) -> None:
        for scheduler in self.schedulers:
            scheduler.wait_idle()

    def at(self, seconds: float) -> None:
        self.clock.set(s(seconds))
        self.idle()

    def run(self, start: float, finish: float) -> None:
        """Move to ``start``, where a run must start, and let it finish at ``finish``."""
        self.clock.set(s(start))
        self.runs.wait_started(len(self.runs.ran) + 1)
        self.clock.set(s(finish))
        self.runs.finish.set()
        self.idle()

    def ticks(self) -> list[datetime]:
        return self.runs.ticks()


@pytest.fixture
def replicas(store: Store) -> Iterator[Replicas]:
    made = Replicas(store)
    for scheduler in made.schedulers:
        scheduler.add_job(after(seconds=5), made.task, name="chain")
        scheduler.start()
    made.idle()
    yield made
    made.runs.finish.set()
    for scheduler in made.schedulers:
        scheduler.shutdown(timeout=10)


def test_each_tick_follows_the_last_recorded_finish_once(replicas: Replicas) -> None:
    replicas.run(5, 7.5)  # the first tick: every(5 s)'s first after the start
    # The replica that ran it reads its finish at once (the others by their next read).
    runner = replicas.schedulers[int(replicas.runs.ran[0][0].removeprefix("r"))]
    assert runner.get_job("chain").next_run() == s(12.5)
    replicas.at(12.4)  # 0.1 s before the next, every replica has read the finish
    assert replicas.ticks() == [s(5)]
    replicas.run(12.5, 13)
    replicas.runs.fail = True
    replicas.run(18, 21.25)
    replicas.runs.fail = False
    replicas.run(26.25, 26.5)
    replicas.at(31.4)
    assert replicas.ticks() == [s(5), s(12.5), s(18), s(26.25)]
    assert replicas.runs.most_at_once == 1
    recorded = replicas.store.recorded("chain")
    assert {tick: r.outcome for tick, r in recorded.items()} == {
        s(5): "succeeded",
        s(12.5): "succeeded",
        s(18): "failed",
        s(26.25): "succeeded",
    }
    assert not replicas.recorder.of("on_skipped")
    for scheduler in replicas.schedulers:
        assert scheduler.get_job("chain").next_run() == s(31.5)


def test_no_tick_while_the_last_run_goes_on(replicas: Replicas) -> None:
    replicas.clock.set(s(5))
    replicas.runs.wait_started(1)
    runner = replicas.runs.ran[0][0]
    others = [x for i, x in enumerate(replicas.schedulers) if f"r{i}" != runner]
    for later in (10, 15, 60):  # far past the delay: still the one run
        replicas.clock.set(s(later))
        for scheduler in others:  # (the runner is busy: never idle)
            scheduler.wait_idle()
            assert scheduler.get_job("chain").next_run() is None
    assert replicas.ticks() == [s(5)]
    replicas.runs.finish.set()
    replicas.idle()
    replicas.run(65, 66)
    assert replicas.ticks() == [s(5), s(65)]


def test_run_now_leaves_the_chain_alone(replicas: Replicas) -> None:
    replicas.run(5, 6)  # the next tick: 11
    job = replicas.schedulers[1].get_job("chain")
    replicas.clock.set(s(8.25))
    job.run_now()
    replicas.runs.wait_started(2)
    replicas.clock.set(s(9))
    replicas.runs.finish.set()
    replicas.idle()
    assert job.next_run() == s(11)
    replicas.run(11, 11.5)
    assert replicas.ticks() == [s(5), s(8.25), s(11)]


def test_last_finishes_reads_the_latest_tick_and_its_end(backends: Backends) -> None:
    from replicron.backends.base import ClaimRequest, Release, RunRecord

    async def main() -> None:
        [handle] = await backends.open(1)
        assert isinstance(handle, LastFinishes)
        assert await handle.last_finishes(["a", "b"]) == {}
        replica_id = backends.replica_id(handle)
        [first] = await handle.claim([ClaimRequest("a", s(5), lock=True)])
        assert await handle.last_finishes(["a"]) == {"a": LastFinish(s(5), None, None)}
        record = RunRecord("a", s(5), Outcome.SUCCEEDED, replica_id, first.run_id, s(5), s(7), None)
        await handle.release([Release(record, True)])
        # A manual run later is not a tick of the chain.
        [manual] = await handle.claim([ClaimRequest("a", s(9), lock=True, manual=True)])
        assert await handle.last_finishes(["a", "b", "a"]) == {
            "a": LastFinish(s(5), s(7), Outcome.SUCCEEDED)
        }
        assert manual.run_id is not None

    backends.run(main())
