"""The bookkeeping of claiming by capacity (``_engine.capacity``), without a scheduler."""

from __future__ import annotations

from datetime import timedelta

from replicron._engine.capacity import Spreader
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
    assert spreader.split(ticks, 10, every_job) == (ticks, [])
    assert not spreader


def test_over_room_a_replica_claims_its_room_and_keeps_the_rest_for_later() -> None:
    spreader = Spreader("r0")
    now, replaced = spreader.split(burst(), 12, every_job)
    assert len(now) == 12
    assert replaced == []
    assert sorted([t.job for t in now] + list(spreader.deferred)) == JOBS  # none lost
    left = set(JOBS) - {t.job for t in now}
    later, _ = spreader.split([], 500, every_job)
    assert sorted(t.job for t in later) == sorted(left)
    assert len(left) == 288
    assert not spreader


def test_replicas_try_different_ticks_first() -> None:
    firsts = [
        {tick.job for tick in Spreader(f"replica-{n}").split(burst(), 16, every_job)[0]}
        for n in range(3)
    ]
    # Three random 16-of-300 picks share about one job each; identical orders would share 16.
    assert all(len(a & b) <= 4 for a in firsts for b in firsts if a is not b)
    # The same replica picks the same ones every time (it is a hash, not chance).
    assert {t.job for t in Spreader("replica-0").split(burst(), 16, every_job)[0]} == firsts[0]


def test_ticks_that_need_no_thread_are_never_held_back() -> None:
    spreader = Spreader("r0")
    is_sync = {job: n % 2 == 0 for n, job in enumerate(JOBS)}
    now, _ = spreader.split(burst(), 5, is_sync.__getitem__)
    assert {t.job for t in now if not is_sync[t.job]} == {j for j in JOBS if not is_sync[j]}
    assert sum(is_sync[t.job] for t in now) == 5


def test_a_newer_tick_of_a_job_replaces_its_older_one_left_unclaimed() -> None:
    spreader = Spreader("r0")
    spreader.split(burst(jobs=["a", "b", "c"]), 0, every_job)
    later = AT + timedelta(seconds=1)
    now, replaced = spreader.split(burst(later, ["a", "b", "c"]), 1, every_job)
    # The oldest ticks go first: one of them is claimed, the two others are replaced by
    # their jobs' newer ticks, which wait in their turn.
    assert [t.scheduled_at for t in now] == [AT]
    assert sorted(t.job for t in replaced) == sorted({"a", "b", "c"} - {now[0].job})
    assert all(t.scheduled_at == AT for t in replaced)
    assert {t.scheduled_at for t in spreader.deferred.values()} == {later}
    assert sorted(spreader.deferred) == ["a", "b", "c"]


def test_at_shutdown_every_tick_left_is_handed_back() -> None:
    spreader = Spreader("r0")
    spreader.split(burst(), 0, every_job)
    assert sorted(t.job for t in spreader.take_all()) == JOBS
    assert not spreader
