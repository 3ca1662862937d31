"""The bookkeeping of claiming by capacity (``_engine.capacity``), without a scheduler."""

from __future__ import annotations

import math
from datetime import timedelta

from replicron._engine.capacity import MOST_ROUNDS_IN_HAND, PROMPTLY, Spreader, claim_margin
from replicron._engine.planner import Tick
from tests.helpers import z

AT = z(2026, 1, 1)
JOBS = [f"job-{n:03}" for n in range(300)]


def burst(at: object = AT, jobs: list[str] = JOBS) -> list[Tick]:
    return [Tick(job, at) for job in jobs]  # type: ignore[arg-type]


def every_job(job: str) -> bool:
    return True


def test_a_burst_within_room_is_claimed_whole_and_in_order() -> None:
    spreader = Spreader("r0")
    ticks = burst(jobs=JOBS[:10])
    assert spreader.split(ticks, 10, every_job, AT) == (ticks, [])
    assert not spreader


def test_over_room_a_replica_claims_its_room_and_keeps_the_rest_for_later() -> None:
    spreader = Spreader("r0")
    now, replaced = spreader.split(burst(), 12, every_job, AT)
    assert len(now) == 12
    assert replaced == []
    assert sorted([t.job for t in now] + list(spreader.deferred)) == JOBS  # none lost
    left = set(JOBS) - {t.job for t in now}
    later, _ = spreader.split([], 500, every_job, AT)
    assert sorted(t.job for t in later) == sorted(left)
    assert len(left) == 288
    assert not spreader


def test_replicas_try_different_ticks_first() -> None:
    firsts = [
        {tick.job for tick in Spreader(f"replica-{n}").split(burst(), 16, every_job, AT)[0]}
        for n in range(3)
    ]
    # Three random 16-of-300 picks share about one job each; identical orders would share 16.
    assert all(len(a & b) <= 4 for a in firsts for b in firsts if a is not b)
    # The same replica picks the same ones every time (it is a hash, not chance).
    assert {t.job for t in Spreader("replica-0").split(burst(), 16, every_job, AT)[0]} == firsts[0]


def test_ticks_that_need_no_thread_are_never_held_back() -> None:
    spreader = Spreader("r0")
    is_sync = {job: n % 2 == 0 for n, job in enumerate(JOBS)}
    now, _ = spreader.split(burst(), 5, is_sync.__getitem__, AT)
    assert {t.job for t in now if not is_sync[t.job]} == {j for j in JOBS if not is_sync[j]}
    assert sum(is_sync[t.job] for t in now) == 5


def test_a_newer_tick_of_a_job_replaces_its_older_one_left_unclaimed() -> None:
    spreader = Spreader("r0")
    spreader.split(burst(jobs=["a", "b", "c"]), 0, every_job, AT)
    later = AT + timedelta(seconds=1)
    now, replaced = spreader.split(burst(later, ["a", "b", "c"]), 1, every_job, AT)
    # The oldest ticks go first: one of them is claimed, the two others are replaced by
    # their jobs' newer ticks, which wait in their turn.
    assert [t.scheduled_at for t in now] == [AT]
    assert sorted(t.job for t in replaced) == sorted({"a", "b", "c"} - {now[0].job})
    assert all(t.scheduled_at == AT for t in replaced)
    assert {t.scheduled_at for t in spreader.deferred.values()} == {later}
    assert sorted(spreader.deferred) == ["a", "b", "c"]


def test_at_shutdown_every_tick_left_is_handed_back() -> None:
    spreader = Spreader("r0")
    spreader.split(burst(), 0, every_job, AT)
    assert sorted(t.job for t in spreader.take_all()) == JOBS
    assert not spreader


def test_the_margin_is_what_the_threads_finish_promptly_or_in_one_claims_round_trip() -> None:
    assert claim_margin(10) == 5  # nothing measured yet: half the threads
    assert claim_margin(10, round_trip=0.030) == 5
    assert claim_margin(10, run_seconds=0.005) == 5
    # Times that are exact in binary. Claims quicker than PROMPTLY: what the threads finish
    # in PROMPTLY; slower ones: in one round trip.
    assert PROMPTLY < 1 / 8
    assert claim_margin(10, round_trip=1 / 32, run_seconds=1 / 64) == math.ceil(10 * 64 * PROMPTLY)
    assert claim_margin(10, round_trip=1 / 4, run_seconds=1 / 64) == 160
    assert claim_margin(10, round_trip=1 / 4, run_seconds=1 / 8) == 20  # longer runs
    assert claim_margin(10, round_trip=1 / 4, run_seconds=3 / 4) == 4  # rounded up


def test_the_margin_stays_within_bounds() -> None:
    # Runs far longer than a claim: one in hand. Runs of no length at all: some rounds of the
    # threads at most, so that one replica never takes a whole burst.
    assert claim_margin(10, round_trip=0.010, run_seconds=60.0) == 1
    assert claim_margin(10, round_trip=0.5, run_seconds=0.0) == MOST_ROUNDS_IN_HAND * 10
    assert claim_margin(4, round_trip=10.0, run_seconds=0.001) == MOST_ROUNDS_IN_HAND * 4


def test_replicas_that_know_each_other_first_claim_disjoint_shares() -> None:
    peers = frozenset({"r1", "r2", "r3"})
    spreaders = [Spreader(name) for name in sorted(peers)]
    for spreader in spreaders:
        spreader.see_peers(peers)
    firsts = [
        {t.job for t in spreader.split(burst(), 80, every_job, AT)[0]} for spreader in spreaders
    ]
    assert all(len(first) == 80 for first in firsts)
    assert firsts[0].isdisjoint(firsts[1] | firsts[2])
    assert firsts[1].isdisjoint(firsts[2])
    # Each job has one first replica: the shares cover the jobs once, about a third each.
    homes = [{job for job in JOBS if spreader.rank(job)[0] == 0} for spreader in spreaders]
    assert sorted(job for home in homes for job in home) == JOBS
    assert all(len(JOBS) / 5 < len(home) < len(JOBS) / 2 for home in homes)


def test_without_peers_each_replica_has_an_order_of_its_own() -> None:
    one, other = Spreader("r1"), Spreader("r2")
    first_one = {t.job for t in one.split(burst(), 80, every_job, AT)[0]}
    first_other = {t.job for t in other.split(burst(), 80, every_job, AT)[0]}
    assert len(first_one & first_other) < 40  # two random draws of 80 from 300 share ~21


def test_ahead_of_an_instant_a_replica_claims_only_the_ticks_it_is_first_for() -> None:
    peers = frozenset({"r1", "r2", "r3"})
    spreader = Spreader("r1")
    spreader.see_peers(peers)
    ahead = AT - timedelta(milliseconds=50)
    claimed, replaced = spreader.split(burst(), 1000, every_job, ahead)
    assert replaced == []
    assert {t.job for t in claimed} == {job for job in JOBS if spreader.rank(job)[0] == 0}
    assert spreader.held_until == AT
    assert spreader.all_held(ahead)
    # From the instant on, the others' ticks are anybody's (their first replica may be gone).
    assert not spreader.all_held(AT)
    later, _ = spreader.split([], 1000, every_job, AT)
    assert sorted(t.job for t in claimed + later) == JOBS
    assert not spreader


def test_alone_a_replica_claims_ahead_whatever_fits() -> None:
    spreader = Spreader("r1")
    spreader.see_peers(frozenset({"r1"}))
    ahead = AT - timedelta(milliseconds=50)
    claimed, _ = spreader.split(burst(), 1000, every_job, ahead)
    assert len(claimed) == len(JOBS)
    assert spreader.held_until is None


def test_ticks_that_need_no_thread_are_held_back_for_their_first_replica_too() -> None:
    spreader = Spreader("r2")
    spreader.see_peers(frozenset({"r1", "r2", "r3"}))
    claimed, _ = spreader.split(burst(), 0, lambda job: False, AT - timedelta(milliseconds=50))
    assert {t.job for t in claimed} == {job for job in JOBS if spreader.rank(job)[0] == 0}
    later, _ = spreader.split([], 0, lambda job: False, AT)
    assert sorted(t.job for t in claimed + later) == JOBS


def test_a_tick_given_twice_is_kept_once_and_replaces_nothing() -> None:
    """A replica starting mid-burst finds the burst's ticks both due and by its catch-up:
    the copy is not a newer tick of the job, and the tick must not be recorded missed."""
    spreader = Spreader("r0")
    ticks = burst()
    now, replaced = spreader.split(ticks + ticks, 12, every_job, AT)
    assert replaced == []
    assert len(now) == len(set(now)) == 12
    assert sorted([t.job for t in now] + list(spreader.deferred)) == JOBS
