"""Fixed-delay jobs (``after``, ``every(..., from_completion=True)``): the trigger, the pure
planning from the ledger's last finish, and a scheduler on a FakeClock restarted over one
memory backend. Replicas sharing a backend, on every backend: tests/contract/test_fixed_delay.py."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

from replicron import (
    FixedDelayTrigger,
    InvalidIntervalError,
    InvalidJobOptionError,
    MemoryBackend,
    MemoryState,
    Outcome,
    Scheduler,
    after,
    current_run,
    every,
)
from replicron._engine.planner import Planner, Tick
from replicron.backends.base import LastFinish
from replicron.testing import FakeClock
from tests.helpers import Recorder, step, z

T0 = z(2026, 1, 1)  # on the grid of every(2 s)
DELAY = timedelta(seconds=2)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ended(tick: float, finished: float | None, outcome: Outcome = Outcome.SUCCEEDED) -> LastFinish:
    return LastFinish(s(tick), None if finished is None else s(finished), outcome)


def running(tick: float) -> LastFinish:
    return LastFinish(s(tick), None, None)


# ---- the trigger ---------------------------------------------------------------------------


def test_after_and_every_from_completion_are_one_trigger() -> None:
    trigger = after(seconds=2)
    assert trigger == every(seconds=2, from_completion=True) == after(DELAY)
    assert isinstance(trigger, FixedDelayTrigger)
    assert trigger.delay == DELAY
    assert repr(trigger) == "after(timedelta(seconds=2))"
    assert trigger != every(seconds=2)  # a fixed rate is another schedule
    assert isinstance(trigger.for_job("report"), FixedDelayTrigger)
    assert isinstance(trigger.with_default_anchor(s(1)), FixedDelayTrigger)
    # Its first tick is the anchored interval's: the same on every replica.
    assert trigger.next_after(s(0.5)) == s(2)
    assert trigger.with_default_anchor(s(1)).next_after(s(0.5)) == s(1)


@pytest.mark.parametrize(
    "build",
    [
        lambda: after(seconds=0),
        lambda: after(),
        lambda: every(seconds=2, jitter=1, from_completion=True),
        lambda: every(between=(1, 2), from_completion=True),
    ],
)
def test_a_bad_delay_fails_at_construction(build: Any) -> None:
    with pytest.raises(InvalidIntervalError):
        build()


# ---- the planner ---------------------------------------------------------------------------


def planned(at: float = 0.5, **options: Any) -> Planner:
    planner = Planner()
    planner.add("j", after(seconds=2).for_job("j"), s(at), **options)
    return planner


def test_a_job_with_no_row_starts_at_the_anchored_tick_checked_again_at_its_instant() -> None:
    planner = planned()
    assert planner.chains_to_read(s(0.5)) == ["j"]  # the ledger first
    planner.learn("j", None, s(0.5))
    assert planner.next_due("j") == s(2)
    assert planner.chains_to_read(s(1.9)) == []
    assert planner.decide(s(1.9)).due == []
    # At its instant the ledger is read once more (another replica may have claimed it).
    assert planner.chains_to_read(s(2)) == ["j"]
    planner.learn("j", None, s(2))
    assert planner.decide(s(2)).due == [Tick("j", s(2))]
    assert planner.next_due("j") is None  # the next one follows that run's finish


def test_a_replica_starting_after_the_first_claim_follows_that_chain() -> None:
    planner = planned(at=2.0)  # the anchored tick 4 would start a second chain
    assert planner.chains_to_read(s(2)) == ["j"]
    planner.learn("j", running(2), s(2))  # another replica runs tick 2
    assert planner.next_due("j") is None
    assert planner.decide(s(4)).due == []
    assert planner.chains_to_read(s(4)) == ["j"]
    planner.learn("j", ended(2, 4.5), s(4.6))
    assert planner.next_due("j") == s(6.5)
    assert planner.decide(s(6.5)).due == [Tick("j", s(6.5))]


def test_a_first_tick_is_not_handed_out_ahead_of_the_read_at_its_instant() -> None:
    """Two replicas started on either side of tick 2: the earlier one claims 2 at about 2.0,
    the later one plans 4. Deciding a claim lead ahead of 4 (at 3.95, for 4) must not hand 4
    out before the ledger is read at 4, where the earlier one's row shows: one chain."""
    planner = planned(at=2.01)
    assert planner.chains_to_read(s(2.01)) == ["j"]
    planner.learn("j", None, s(2.01))  # the earlier replica's claim is not committed yet
    assert planner.next_due("j") == s(4)
    assert planner.decide(s(4)).due == []  # at 3.95, deciding up to 4: not read at 4 yet
    assert planner.chain_read_at() == s(4)
    assert planner.chains_to_read(s(3.95)) == []
    assert planner.chains_to_read(s(4)) == ["j"]
    planner.learn("j", ended(2, 2.5), s(4))
    assert planner.next_due("j") == s(4.5)
    assert planner.decide(s(4.5)).due == [Tick("j", s(4.5))]


def test_the_next_tick_is_the_last_finish_plus_the_delay() -> None:
    planner = planned()
    planner.learn("j", None, s(2))
    assert planner.decide(s(2)).due == [Tick("j", s(2))]
    assert planner.upcoming("j", 3) == []
    # Read a little after the tick while it runs (no next tick), then at its finish.
    assert planner.chains_to_read(s(2.4)) == []
    assert planner.chains_to_read(s(2.5)) == ["j"]
    planner.learn("j", running(2), s(2.5))
    assert planner.next_due("j") is None
    assert planner.chain_read_at() == s(3)
    planner.learn("j", ended(2, 3.25), s(3.3))
    assert planner.next_due("j") == s(5.25)
    assert planner.upcoming("j", 3) == [s(5.25)]
    assert planner.chain_read_at() is None  # known: no more reads until it is handed out
    assert planner.decide(s(5.2)).due == []
    assert planner.decide(s(5.25)).due == [Tick("j", s(5.25))]


def test_the_finished_replica_reads_at_once() -> None:
    planner = planned()
    planner.learn("j", None, s(2))
    planner.decide(s(2))
    planner.finished_here("j", s(2.1))
    assert planner.chains_to_read(s(2.1)) == ["j"]


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome.FAILED,
        Outcome.TIMED_OUT,
        Outcome.ABANDONED,
        Outcome.MISSED,
        Outcome.SKIPPED_OVERLAP,
        Outcome.PAUSED,
    ],
)
def test_a_row_ended_without_a_normal_finish_continues_the_chain(outcome: Outcome) -> None:
    planner = planned()
    planner.learn("j", ended(6, 9, outcome), s(9.5))  # ended (recorded) at 9
    assert planner.next_due("j") == s(11)


def test_a_row_ended_with_no_finish_time_counts_from_its_tick() -> None:
    planner = planned()
    planner.learn("j", ended(6, None, Outcome.PAUSED), s(9))
    assert planner.next_due("j") == s(8)


def test_a_row_older_than_the_tick_handed_out_says_nothing() -> None:
    planner = planned()
    planner.learn("j", ended(0, 0.5), s(1))
    assert planner.next_due("j") == s(2.5)
    assert planner.decide(s(2.5)).due == [Tick("j", s(2.5))]
    # Read before its claim is in: the previous row must not plan tick 2.5 again.
    planner.learn("j", ended(0, 0.5), s(3))
    assert planner.next_due("j") is None
    planner.learn("j", ended(2.5, 3.5), s(4))
    assert planner.next_due("j") == s(5.5)


def test_an_old_finish_gives_one_tick_due_at_once() -> None:
    planner = planned(at=100)  # every replica was down for a while
    planner.learn("j", ended(6, 7), s(100))
    decision = planner.decide(s(100))
    assert decision.due == [Tick("j", s(9))]  # once, late; nothing replayed
    assert decision.missed == []


def test_start_at_and_stop_at_bound_the_chain() -> None:
    planner = planned(start_at=s(20), stop_at=s(30))
    planner.learn("j", ended(6, 7), s(1))
    assert planner.next_due("j") == s(20)
    planner.learn("j", ended(20, 29), s(29))
    assert planner.next_due("j") is None


def test_prepare_leaves_fixed_delay_ticks_to_their_instant() -> None:
    planner = Planner()
    planner.add("j", after(seconds=2).for_job("j"), s(0.5))
    planner.add("k", every(seconds=2), s(0.5))
    planner.learn("j", None, s(0.5))
    assert planner.prepare() == 1
    assert planner.prepared() == [Tick("k", s(2))]
    assert planner.next_due("j") == s(2)
    planner.learn("j", None, s(2))
    assert sorted(planner.decide(s(2)).due) == [Tick("j", s(2)), Tick("k", s(2))]


# ---- schedulers on a FakeClock -------------------------------------------------------------


def test_a_tick_from_an_old_finish_runs_once_late_or_is_missed_past_misfire_grace() -> None:
    state, clock = MemoryState(), FakeClock(s(0.5))
    ran: list[datetime] = []

    def task() -> None:
        ran.append(current_run().scheduled_at)

    def replica() -> Scheduler:
        scheduler = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="r0")
        scheduler.add_job(after(seconds=2), task, name="j")
        scheduler.start()
        return scheduler

    first = replica()
    clock.set(s(2))
    first.wait_idle()
    first.shutdown(timeout=5)
    # Every replica was down; one starts 100 s later: the tick 4 is run once, at once.
    clock.set(s(100))
    second = replica()
    second.wait_idle()
    assert ran == [s(2), s(4)]
    assert second.get_job("j").next_run() == s(102)
    second.shutdown(timeout=5)
    # With misfire_grace the late tick is missed instead, and the chain goes on from then.
    clock.set(s(200))
    recorder = Recorder()
    third = Scheduler(clock=clock, backend=MemoryBackend(state), listeners=[recorder])
    third.add_job(after(seconds=2), task, name="j", misfire_grace=10)
    third.start()
    third.wait_idle()
    assert [(e.scheduled_at, e.outcome) for e in recorder.of("on_missed")] == [
        (s(102), Outcome.MISSED)
    ]
    assert third.get_job("j").next_run() == s(202)
    third.shutdown(timeout=5)
    assert len(ran) == 2


class _NoLedgerReads(MemoryBackend):
    """A backend of one's own without ``last_finishes``."""

    last_finishes = None  # type: ignore[assignment]


def test_a_backend_that_cannot_read_finishes_is_refused_at_registration() -> None:
    scheduler = Scheduler(backend=_NoLedgerReads())
    with pytest.raises(InvalidJobOptionError, match=r"job 'j'.*after\(.*last_finishes"):
        scheduler.add_job(after(seconds=2), lambda: None, name="j")
    scheduler.add_job(every(seconds=2), lambda: None, name="k")
    scheduler.shutdown()


def test_the_memory_backend_keeps_the_last_ticks_end_past_its_history() -> None:
    from replicron.backends.base import ClaimRequest, Release, RunRecord
    from replicron.backends.memory import HISTORY_KEPT

    async def main() -> dict[str, LastFinish]:
        backend = MemoryBackend()
        await backend.open("r0")
        [claim] = await backend.claim([ClaimRequest("j", s(2), lock=True)])
        done = RunRecord("j", s(2), Outcome.SUCCEEDED, "r0", claim.run_id, s(2), s(3), None)
        await backend.release([Release(done, True)])
        for k in range(HISTORY_KEPT + 2):  # manual runs push the tick out of the history
            at = s(4 + k)
            [manual] = await backend.claim([ClaimRequest("j", at, lock=True, manual=True)])
            record = RunRecord("j", at, Outcome.SUCCEEDED, "r0", manual.run_id, at, at, None, True)
            await backend.release([Release(record, True)])
        return await backend.last_finishes(["j"])

    assert asyncio.run(main()) == {"j": LastFinish(s(2), s(3), Outcome.SUCCEEDED)}


def test_a_run_missed_on_its_thread_continues_the_chain_from_when_it_was_missed() -> None:
    from tests.helpers import Gate

    clock, recorder = FakeClock(s(5)), Recorder()
    blocker, late = Gate(), Gate()
    late.release.set()
    scheduler = Scheduler(clock=clock, listeners=[recorder], max_workers=1)
    scheduler.add_job(every(seconds=10), blocker, name="j0")  # holds the one thread
    job = scheduler.add_job(after(seconds=20), late, name="j1", misfire_grace=60)
    scheduler.start()
    try:
        step(clock, s(10))
        blocker.wait_started(1)
        step(clock, s(20))  # j1's first tick waits for the thread
        step(clock, s(320))
        blocker.release.set()
        [missed] = recorder.wait_count("on_missed", 1, job="j1")
        assert (missed.scheduled_at, missed.finished_at) == (s(20), s(320))
        scheduler.wait_idle()
        assert job.next_run() == s(340)  # not 40: no string of missed ticks to catch up
        assert recorder.of("on_missed", "j1") == [missed]
    finally:
        blocker.release.set()
        scheduler.shutdown(timeout=5)
