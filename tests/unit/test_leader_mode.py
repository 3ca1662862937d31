"""Leader mode on the memory backend, driven by a fake clock: one replica claims every tick
of the leader-mode jobs; the one that takes over catches up what fell due without a leader;
options are checked at registration; the self-fenced term of a lease that runs out."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest

from replicron import (
    InvalidJobOptionError,
    Listener,
    MemoryBackend,
    MemoryState,
    Outcome,
    Scheduler,
    after,
    current_run,
    every,
)
from replicron._engine.capacity import Spreader
from replicron._engine.leadership import Leadership
from replicron._engine.planner import Decision, Tick
from replicron.backends.embedded import EmbeddedBackend
from replicron.backends.leadership import Leader, LeaderTerm
from replicron.testing import FakeClock
from tests.helpers import START
from tests.unit.test_engine_parts import Parts, spec

T = [START + timedelta(seconds=10 * k) for k in range(20)]  # T[k]: tick k of every(10 s)


class LeadershipEvents(Listener):
    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def on_leader_gained(self, replica_id: str) -> None:
        self.told.append(("gained", replica_id))

    def on_leader_lost(self, replica_id: str) -> None:
        self.told.append(("lost", replica_id))


class Ran:
    def __init__(self) -> None:
        self.runs: list[tuple[str, str, datetime]] = []
        self._lock = threading.Lock()

    def __call__(self) -> None:
        run = current_run()
        with self._lock:
            self.runs.append((run.job_name, run.replica_id, run.scheduled_at))


@pytest.fixture
def state() -> MemoryState:
    return MemoryState()


@pytest.fixture
def replicas(clock: FakeClock, state: MemoryState) -> Iterator[list[Scheduler]]:
    made = [
        Scheduler(clock=clock, backend=MemoryBackend(state), replica_id=f"r{i}", leader=True)
        for i in range(3)
    ]
    yield made
    for replica in made:
        replica.shutdown(timeout=5)


def settle(replicas: list[Scheduler]) -> None:
    for replica in replicas:
        if replica.running:
            replica.wait_idle()


def test_the_leader_claims_every_tick_of_leader_mode_jobs(
    clock: FakeClock, replicas: list[Scheduler]
) -> None:
    ran = Ran()
    for replica in replicas:
        replica.start()
        replica.add_job(every(seconds=10), ran, name="led")
        replica.add_job(every(seconds=10), ran, name="free", leader=False)
    assert [replica.is_leader for replica in replicas] == [True, False, False]
    for k in range(1, 7):
        clock.set(T[k])
        settle(replicas)
    led = [(replica, tick) for job, replica, tick in ran.runs if job == "led"]
    assert sorted(tick for _, tick in led) == T[1:7]
    assert {replica for replica, _ in led} == {"r0"}
    assert sorted(t for job, _, t in ran.runs if job == "free") == T[1:7]  # once each


def test_a_new_leader_catches_up_the_ticks_that_fell_due_without_one(
    clock: FakeClock, state: MemoryState, replicas: list[Scheduler]
) -> None:
    """r0 leads but stops scheduling the job after tick 1; the standbys leave ticks 2-4 to
    it; r0 stops at tick 4 + 5 s: r1 takes over, runs the latest (catch_up="latest") and
    records the others missed. Every tick has one record."""
    ran, watch = Ran(), LeadershipEvents()
    r0, r1, r2 = replicas
    r1.add_listener(watch)
    for replica in replicas:
        replica.start()
        replica.add_job(every(seconds=10), ran, name="c")
    clock.set(T[1])
    settle(replicas)
    r0.remove_job("c")
    for k in (2, 3, 4):
        clock.set(T[k])
        settle(replicas)
    assert [t for _, _, t in ran.runs] == [T[1]]  # the standbys claimed nothing
    clock.set(T[4] + timedelta(seconds=5))
    r0.shutdown()
    settle(replicas)
    assert r1.is_leader
    assert not r2.is_leader
    assert watch.told == [("gained", "r1")]
    outcomes = {r.scheduled_at: (r.outcome, r.replica_id) for r in state.history("c")}
    assert outcomes == {
        T[1]: (Outcome.SUCCEEDED, "r0"),
        T[2]: (Outcome.MISSED, "r1"),
        T[3]: (Outcome.MISSED, "r1"),
        T[4]: (Outcome.SUCCEEDED, "r1"),
    }
    clock.set(T[5])
    settle(replicas)
    assert ran.runs[-1] == ("c", "r1", T[5])


def test_a_job_never_recorded_is_caught_up_from_the_first_tick_left_to_the_leader(
    clock: FakeClock, state: MemoryState, replicas: list[Scheduler]
) -> None:
    ran = Ran()
    r0, r1, _ = replicas
    for replica in replicas:
        replica.start()
    r1.add_job(every(seconds=10), ran, name="only_on_r1", catch_up="none")
    for k in (1, 2, 3):
        clock.set(T[k])
        settle(replicas)
    assert ran.runs == []
    assert r0.is_leader
    r0.shutdown()
    settle(replicas)
    recorded = {r.scheduled_at: r.outcome for r in state.history("only_on_r1")}
    assert recorded == {T[1]: Outcome.MISSED, T[2]: Outcome.MISSED, T[3]: Outcome.MISSED}


@pytest.mark.parametrize("ever_recorded", [True, False])
def test_a_new_leader_goes_on_with_a_fixed_delay_chain_the_old_one_left(
    clock: FakeClock, state: MemoryState, replicas: list[Scheduler], ever_recorded: bool
) -> None:
    """The standbys leave each fixed-delay tick to the leader; the leader goes before it
    claims tick 4 (or the first tick): the one that takes over runs that tick, late, and
    the chain goes on a delay after each finish."""
    ran = Ran()
    r0, r1, r2 = replicas
    for replica in replicas:
        replica.start()
        replica.add_job(after(seconds=10), ran, name="chain")
    stop_at = 4 if ever_recorded else 1
    for k in range(1, stop_at):
        clock.set(T[k])
        settle(replicas)
    r0.remove_job("chain")  # the leader no longer claims its ticks
    clock.set(T[stop_at])
    settle(replicas)
    clock.set(T[stop_at] + timedelta(seconds=5))
    r0.shutdown()
    settle(replicas)
    for k in range(stop_at + 1, stop_at + 4):
        clock.set(T[k] + timedelta(seconds=5))
        settle(replicas)
    assert r1.is_leader
    recorded = [(r.scheduled_at, r.outcome, r.replica_id) for r in state.history("chain")]
    took_over = T[stop_at] + timedelta(seconds=5)
    assert recorded == [(T[k], Outcome.SUCCEEDED, "r0") for k in range(1, stop_at)] + [
        (T[stop_at], Outcome.SUCCEEDED, "r1"),  # left by the standbys, run late
        (took_over + timedelta(seconds=10), Outcome.SUCCEEDED, "r1"),
        (took_over + timedelta(seconds=20), Outcome.SUCCEEDED, "r1"),
        (took_over + timedelta(seconds=30), Outcome.SUCCEEDED, "r1"),
    ]
    assert not r2.is_leader


def test_without_leader_mode_nobody_contends(clock: FakeClock, state: MemoryState) -> None:
    with Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="a") as s:
        s.add_job(every(seconds=10), lambda: None, name="plain")
        s.wait_idle()
        assert state.leader is None
        s.add_job(every(seconds=10), lambda: None, name="opted_in", leader=True)
        s.wait_idle()
        assert state.leader == Leader("a", 1)
        assert s.is_leader


def test_a_lone_scheduler_is_its_own_leader(clock: FakeClock) -> None:
    with Scheduler(clock=clock, leader=True) as s:
        s.wait_idle()
        assert s.is_leader


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_the_scheduler_option_is_checked(bad: object) -> None:
    with pytest.raises(InvalidJobOptionError, match="leader must be True or False"):
        Scheduler(leader=bad)  # type: ignore[arg-type]


def test_the_job_option_is_checked_and_named(scheduler: Scheduler) -> None:
    with pytest.raises(InvalidJobOptionError, match=r"job 'x': leader must be True, False"):
        scheduler.add_job(every(seconds=10), lambda: None, name="x", leader="yes")  # type: ignore[arg-type]
    job = scheduler.add_job(every(seconds=10), lambda: None, name="y", leader=True)
    job.update(leader=False)
    assert job.spec.leader is False


def test_a_term_ends_on_the_clock_of_its_renewals_send() -> None:
    term = LeaderTerm("me")
    changes: list[bool] = []
    term.contend(lambda: changes.append(term.leading()))
    term.seen("me", 3, sent_at=100.0, length=10.0)
    assert term.leader == Leader("me", 3)
    assert term.leading(now=109.999)
    assert not term.leading(now=110.0)
    term.seen("other", 4, sent_at=105.0, length=10.0)
    assert not term.leading(now=105.0)
    assert term.leader == Leader("other", 4)
    term.resigned()
    assert term.leader == Leader("other", 4)
    assert not term.contending


def test_a_term_tells_of_a_change(clock: FakeClock) -> None:
    import time

    term = LeaderTerm("me")
    changes: list[bool] = []
    term.contend(lambda: changes.append(term.leading()))
    now = time.monotonic()
    term.seen("me", 1, sent_at=now, length=60.0)
    term.seen("me", 1, sent_at=now, length=60.0)  # renewed: no change
    term.resigned()
    assert changes == [True, False]


def test_on_the_embedded_backend_a_standby_takes_over_when_the_leader_closes(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        a = EmbeddedBackend(tmp_path, leader_retry=0.05)
        b = EmbeddedBackend(tmp_path, leader_retry=0.05)
        await a.open("a")
        await b.open("b")
        try:
            b_changed = asyncio.Event()
            a.contend(lambda: None)
            while not a.leading():
                await asyncio.sleep(0.01)
            b.contend(b_changed.set)
            await asyncio.sleep(0.2)  # b tried a few times
            assert not b.leading()
            assert b.leader == Leader("a", 1)
            await a.close()
            await asyncio.wait_for(b_changed.wait(), 5)
            assert b.leading()
            assert b.leader == Leader("b", 2)
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


def test_a_replica_that_no_longer_leads_drops_the_leader_ticks_it_deferred() -> None:
    """Ticks a leader left for its own threads to free up are the next leader's once it no
    longer leads: it must not claim them later."""
    state = MemoryState()
    parts = Parts(MemoryBackend(state))
    asyncio.run(parts.backend.open("r1"))
    parts.registry.add_job(spec("led", leader=True))
    parts.registry.add_job(spec("free"))
    leadership = Leadership(parts.backend, parts.registry, parts.observer, lambda: None)
    spreader = leadership.adopt(Spreader("r1"))
    assert spreader is not None
    leadership.job_changed("led")
    assert leadership.step([], T[0], []) == (["led"], {})  # leads at once: catches "led" up
    assert spreader.rank("led") == (0, 0)  # the leader is first for its ticks
    spreader.deferred.update({"led": Tick("led", T[1]), "free": Tick("free", T[1])})
    other = MemoryBackend(state)
    asyncio.run(other.open("r2"))
    other.contend(lambda: None)
    asyncio.run(parts.backend.close())  # the lease goes to r2
    assert leadership.step(["led", "free"], T[0], []) == (["free"], {})
    assert list(spreader.deferred) == ["free"]
    assert spreader.rank("led") != (0, 0)
    decision = Decision(due=[Tick("led", T[2]), Tick("free", T[2])], missed=[Tick("led", T[1])])
    assert leadership.sift([], decision) == [Tick("free", T[2])]
    assert decision.missed == []


def test_a_fixed_delay_tick_a_leader_deferred_is_retaken_when_it_leads_again() -> None:
    """A leader deferred a fixed-delay tick for a free thread and lost the lease: the tick is
    the next leader's. Leading again before the ledger has it, it plans that tick again
    rather than wait for a finish that never comes."""
    state = MemoryState()
    parts = Parts(MemoryBackend(state))
    asyncio.run(parts.backend.open("r1"))
    parts.registry.add_job(spec("chain", leader=True, trigger=after(seconds=10)))
    leadership = Leadership(parts.backend, parts.registry, parts.observer, lambda: None)
    spreader = leadership.adopt(Spreader("r1"))
    assert spreader is not None
    leadership.job_changed("chain")
    assert leadership.step([], T[0], []) == (["chain"], {})
    parts.clock.set(T[1])
    parts.registry.chains_learned(["chain"], {}, T[1])  # read at its instant: no row yet
    [tick] = parts.registry.take_due(T[1])[0].due  # handed out: its next follows its finish
    spreader.deferred["chain"] = tick
    other = MemoryBackend(state)
    asyncio.run(other.open("r2"))
    other.contend(lambda: None)
    asyncio.run(parts.backend.close())  # the lease goes to r2, which goes in turn
    leadership.step([], T[1], [])
    assert parts.registry.next_runs("chain", 1) == []
    asyncio.run(parts.backend.open("r1"))
    parts.backend.contend(lambda: None)
    asyncio.run(other.close())
    assert leadership.step([], T[1], [])[0] == ["chain"]
    assert parts.registry.next_runs("chain", 1) == [T[1]]


class Standby(NamedTuple):
    leader: MemoryBackend
    parts: Parts
    leadership: Leadership


def standby(*jobs: str, free: str = "") -> Standby:
    """Replica r1 with leader-mode ``jobs`` (and a ``free`` one), standing by while r0 leads."""
    state = MemoryState()
    leader = MemoryBackend(state)
    asyncio.run(leader.open("r0"))
    leader.contend(lambda: None)
    parts = Parts(MemoryBackend(state))
    asyncio.run(parts.backend.open("r1"))
    for job in jobs:
        parts.registry.add_job(spec(job, leader=True))
    if free:
        parts.registry.add_job(spec(free))
    leadership = Leadership(parts.backend, parts.registry, parts.observer, lambda: None)
    leadership.job_changed(jobs[0])
    return Standby(leader, parts, leadership)


def test_a_standby_that_takes_over_claims_the_ticks_it_let_go_before_their_instant() -> None:
    """Claims are planned ahead of their instant: a standby lets a leader-mode tick go a
    moment before it is due, and becomes the leader before it is due. The catch-up reaches
    up to its instant only, so the tick is claimed as it comes, neither lost nor claimed
    twice; one let go and due by the takeover is the catch-up's."""
    leader, _, leadership = standby("led", free="free")
    lead = timedelta(milliseconds=50)
    before = T[1] - lead
    assert leadership.step([], before, []) == ([], {})  # r0 leads
    decision = Decision(due=[Tick("led", T[1]), Tick("free", T[1])])
    assert leadership.sift([], decision) == [Tick("free", T[1])]
    asyncio.run(leader.close())  # the lease goes to r1 before T[1]
    immediate: list[Tick] = []
    catch_up, since = leadership.step([], before + lead / 2, immediate)
    assert (catch_up, since) == (["led"], {"led": T[1] - timedelta(microseconds=1)})
    assert immediate == [Tick("led", T[1])]
    again: list[Tick] = []
    leadership.step([], T[1], again)  # handed out once
    assert again == []


def test_a_tick_let_go_and_due_by_the_takeover_is_left_to_the_catch_up() -> None:
    leader, _, leadership = standby("led")
    leadership.step([], T[1] - timedelta(milliseconds=50), [])
    assert leadership.sift([Tick("led", T[1])], Decision()) == []
    asyncio.run(leader.close())
    immediate: list[Tick] = []
    assert leadership.step([], T[1], immediate)[0] == ["led"]
    assert immediate == []  # (last row, T[1]] is the catch-up's


def test_a_tick_let_go_of_a_job_removed_since_is_not_claimed_at_the_takeover() -> None:
    leader, parts, leadership = standby("led", "gone")
    leadership.step([], T[1] - timedelta(milliseconds=50), [])
    assert leadership.sift([Tick("led", T[1]), Tick("gone", T[1])], Decision()) == []
    parts.registry.remove_job("gone")
    asyncio.run(leader.close())
    immediate: list[Tick] = []
    leadership.step([], T[1] - timedelta(milliseconds=10), immediate)
    assert immediate == [Tick("led", T[1])]


def test_a_term_won_during_a_step_claims_nothing_before_the_next_steps_catch_up() -> None:
    """The term can pass to this replica while a step waits on its statements (a lease's
    renewal runs beside the loop). That step still leaves the leader-mode ticks alone: the
    next one catches the job up from the last leader's row first. Claimed at once, the
    tick would be the ledger's latest, and the ticks between the last leader's and it,
    which fell due without a leader, would never get a record."""
    leader, _, leadership = standby("led", free="free")
    before = T[1] - timedelta(milliseconds=50)
    assert leadership.step([], before, []) == ([], {})  # r0 leads as the step begins
    asyncio.run(leader.close())  # the term goes to r1 during the step's statements
    decision = Decision(due=[Tick("led", T[1]), Tick("free", T[1])], missed=[Tick("led", T[0])])
    assert leadership.sift([], decision) == [Tick("free", T[1])]
    assert decision.missed == []
    immediate: list[Tick] = []
    catch_up, _ = leadership.step([], before + timedelta(milliseconds=10), immediate)
    assert catch_up == ["led"]  # the catch-up of the next step, then the tick let go
    assert immediate == [Tick("led", T[1])]
