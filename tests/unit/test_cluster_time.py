"""One clock for the cluster, the replica's lease, and ticks handled again after a backend
failure: the pure parts, without a database."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from replicron import every
from replicron._engine.planner import MAX_ENUMERATED_TICKS, resync_plan, ticks_from
from replicron.clock import ClusterClock
from replicron.postgres._deadline import RunDeadline
from replicron.postgres._offset import OffsetEstimator
from replicron.testing import FakeClock
from tests.helpers import z

T0 = z(2026, 3, 1, 12)


def test_the_offset_comes_from_the_sample_with_the_shortest_round_trip() -> None:
    estimator = OffsetEstimator(keep=4, window=60)
    assert estimator.current is None
    base = T0.timestamp()
    # The database is 30 s behind; slow round trips carry an error of up to half their length.
    estimator.add(T0 - timedelta(seconds=30) + timedelta(seconds=0.4), base, base + 1.0, 10, 11)
    estimator.add(T0 - timedelta(seconds=30), base - 0.001, base + 0.001, 20, 20.002)
    estimator.add(T0 - timedelta(seconds=30) + timedelta(seconds=0.1), base, base + 0.5, 30, 30.5)
    assert estimator.current is not None
    assert estimator.current.total_seconds() == pytest.approx(-30.0, abs=1e-6)


def test_old_samples_stop_counting_so_a_drifting_clock_is_followed() -> None:
    estimator = OffsetEstimator(keep=8, window=60)
    base = T0.timestamp()
    estimator.add(T0, base, base + 0.001, 0.0, 0.001)  # offset 0, excellent round trip
    estimator.add(T0 + timedelta(seconds=2), base, base + 0.01, 100.0, 100.01)  # 100 s later
    assert estimator.current is not None
    assert estimator.current.total_seconds() == pytest.approx(2 - 0.005, abs=1e-6)


def test_a_clock_step_is_followed_at_once_not_after_the_window() -> None:
    estimator = OffsetEstimator(keep=16, window=300)
    base = T0.timestamp()
    for k in range(5):  # excellent samples: offset 0
        estimator.add(T0 + timedelta(seconds=k), base + k, base + k + 0.001, k, k + 0.001)
    assert estimator.current is not None
    assert abs(estimator.current.total_seconds()) < 1e-3
    # This replica's clock steps 30 s ahead: its wall clock reads 30 s more than before.
    stepped = base + 10 + 30
    estimator.add(T0 + timedelta(seconds=10), stepped, stepped + 0.02, 10, 10.02)
    assert estimator.current is not None
    assert estimator.current.total_seconds() == pytest.approx(-30.01, abs=1e-6)


def test_the_cluster_clock_shifts_the_base_clock_by_the_current_offset() -> None:
    base = FakeClock(T0)
    offset: list[timedelta | None] = [None]
    clock = ClusterClock(base, lambda: offset[0])
    assert clock.now() == T0  # not measured yet: the base clock's time
    offset[0] = timedelta(seconds=-30)
    assert clock.now() == T0 - timedelta(seconds=30)
    base.advance(timedelta(seconds=5))
    assert clock.now() == T0 - timedelta(seconds=25)


@pytest.mark.parametrize(
    ("policy", "grace", "superseded", "run", "missed"),
    [
        ("latest", None, False, [3], [1, 2]),
        ("latest", timedelta(seconds=5), False, [], [1, 2, 3]),  # the latest is 9 s old
        ("latest", timedelta(seconds=9), False, [3], [1, 2]),  # the grace is inclusive
        ("all", None, False, [1, 2, 3], []),
        ("none", None, False, [], [1, 2, 3]),
        ("latest", None, True, [], [1, 2, 3]),  # a later tick is due: it coalesces them
        ("all", None, True, [], [1, 2, 3]),
    ],
)
def test_ticks_whose_handling_failed_follow_the_catch_up_policy(
    policy: str, grace: timedelta | None, superseded: bool, run: list[int], missed: list[int]
) -> None:
    trigger = every(seconds=1)
    tick = [T0 + timedelta(seconds=n) for n in range(5)]
    found = resync_plan(
        trigger,
        tick[1],
        tick[3],
        tick[3] + timedelta(seconds=9),
        policy,  # type: ignore[arg-type]
        grace,
        superseded,
    )
    assert found == ([tick[n] for n in run], [tick[n] for n in missed], None)


def test_ticks_from_lists_both_ends_and_keeps_the_latest_when_there_are_too_many() -> None:
    trigger = every(seconds=1)
    assert ticks_from(trigger, T0, T0 + 2 * timedelta(seconds=1)) == [
        T0 + timedelta(seconds=n) for n in range(3)
    ]
    last = T0 + timedelta(seconds=MAX_ENUMERATED_TICKS + 10)
    many = ticks_from(trigger, T0, last)
    assert len(many) == MAX_ENUMERATED_TICKS
    assert many[-1] == last
    assert many[0] == last - timedelta(seconds=MAX_ENUMERATED_TICKS - 1)


def test_the_lease_expires_from_the_last_proof_of_life_that_was_sent() -> None:
    async def main() -> None:
        expired: list[list[int]] = []
        lease = RunDeadline(1.0, expired.append)
        now = asyncio.get_running_loop().time()
        lease.start(1, now - 0.6)
        lease.start(2, now - 0.2)
        assert lease.expires_at() == pytest.approx(now + 0.4)
        lease.renew([1], now - 0.1)  # a heartbeat sent 0.1 s ago refreshed run 1
        assert lease.expires_at() == pytest.approx(now + 0.8)
        lease.renew([2], now - 5.0)  # an older proof never shortens a lease
        assert lease.expires_at() == pytest.approx(now + 0.8)
        lease.start(3, now - 2.0)  # proven long ago: expires at the next check
        lease.renew([3], now)  # a heartbeat sent after its lease ended does not revive it
        assert lease.end_of(3) == pytest.approx(now - 1.0)
        lease._check()
        assert expired == [[3]]
        assert 3 not in lease
        lease.end([1, 2])
        assert lease.expires_at() is None

    asyncio.run(main())
