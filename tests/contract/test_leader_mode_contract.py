"""Leader mode on every backend: of several schedulers sharing a store, exactly one leads,
and it claims every tick of the leader-mode jobs; the others claim none of them (they still
share the other jobs). Every tick has its record."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from replicron import Scheduler, current_run, every
from replicron.testing import FakeClock
from tests.contract.conftest import STORES, Store, replica
from tests.helpers import Recorder, poll_until, z

START = z(2026, 1, 1)
T = [START + timedelta(seconds=10 * k) for k in range(8)]


@pytest.fixture(params=list(STORES))
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with STORES[request.param]() as made:
        yield made


def test_one_of_several_schedulers_claims_every_leader_mode_tick(store: Store) -> None:
    clock = FakeClock(START)
    recorders = [Recorder() for _ in range(3)]
    schedulers: list[Scheduler] = [
        replica(store, i, clock, recorders[i], leader=True) for i in range(3)
    ]
    ran: list[tuple[str, str, datetime]] = []
    lock = threading.Lock()

    def task() -> None:
        run = current_run()
        with lock:
            ran.append((run.job_name, run.replica_id, run.scheduled_at))

    def recorded_both(tick: datetime) -> bool:
        return all(tick in store.recorded(job) for job in ("led", "shared"))

    try:
        for scheduler in schedulers:
            scheduler.add_job(every(seconds=10), task, name="led")
            scheduler.add_job(every(seconds=10), task, name="shared", leader=False)
            scheduler.start()
        poll_until("a leader", lambda: any(s.is_leader for s in schedulers), 20)
        leaders = [s.replica_id for s in schedulers if s.is_leader]
        assert len(leaders) == 1
        for k in range(1, 6):
            clock.set(T[k])
            poll_until(f"tick {k} recorded", functools.partial(recorded_both, T[k]), 20)
            for scheduler in schedulers:
                scheduler.wait_idle()
        assert [s.replica_id for s in schedulers if s.is_leader] == leaders
        # The cluster's status names the leader, as any replica reads it.
        assert {s.cluster_status().leader for s in schedulers} == {leaders[0]}
    finally:
        for scheduler in schedulers:
            scheduler.shutdown(timeout=5)
    led = store.recorded("led")
    assert sorted(led) == T[1:6]
    assert {(r.outcome, r.replica_id) for r in led.values()} == {("succeeded", leaders[0])}
    assert sorted(tick for job, _, tick in ran if job == "led") == T[1:6]  # each once
    shared = store.recorded("shared")
    assert sorted(shared) == T[1:6]
    assert {r.outcome for r in shared.values()} == {"succeeded"}
