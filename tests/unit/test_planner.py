"""The planner: the pure scheduling decision, tested with plain datetimes.

No threads, event loops or sleeps: every call takes ``now``. Expected ticks are written out by
hand or computed with integer arithmetic here, never asked of the planner or the triggers.

T0 = 2026-01-01T00:00:00Z is a whole number of days after the Unix epoch, so it lies on the
grid of every epoch-anchored interval that divides a day (10 s, 60 s, 1 s, ...).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicron import cron, every, once
from replicron._engine.planner import (
    MAX_ENUMERATED_TICKS,
    Planner,
    Span,
    Tick,
    catch_up_plan,
    overlap_action,
)
from replicron.triggers import Trigger
from tests.helpers import z

T0 = z(2026, 1, 1)
US = timedelta(microseconds=1)


def s(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def ticks(job: str, *seconds: float) -> list[Tick]:
    return [Tick(job, s(x)) for x in seconds]


def test_t0_is_on_the_epoch_grid() -> None:
    # The premise of every expectation below that uses an epoch-anchored interval.
    epoch = z(1970, 1, 1)
    assert (T0 - epoch) % timedelta(days=1) == timedelta(0)


# ---- add: the first tick ---------------------------------------------------------------


def test_empty_planner() -> None:
    planner = Planner()
    assert len(planner) == 0
    assert "a" not in planner
    assert planner.wake_at() is None
    assert planner.next_due("a") is None
    assert planner.upcoming("a", 3) == []
    decision = planner.decide(s(1000))
    assert decision.due == []
    assert decision.missed == []
    assert decision.older_missed == {}
    assert decision.wake_at is None


def test_add_plans_the_first_tick_strictly_after_now() -> None:
    planner = Planner()
    # now exactly on a tick: that tick is not planned, the next one is.
    assert planner.add("on", every(seconds=10), s(0)) == s(10)
    # now between ticks, and a microsecond before a tick.
    assert planner.add("between", every(seconds=10), s(3)) == s(10)
    assert planner.add("just-before", every(seconds=10), s(10) - US) == s(10)
    # now a microsecond after a tick.
    assert planner.add("just-after", every(seconds=10), s(10) + US) == s(20)
    assert len(planner) == 4
    assert "on" in planner
    assert "other" not in planner
    assert planner.next_due("on") == s(10)
    assert planner.next_due("just-after") == s(20)
    assert planner.wake_at() == s(10)


def test_add_cron_first_tick_strictly_after_now() -> None:
    planner = Planner()
    assert planner.add("on", cron("*/5 * * * *"), s(0)) == s(300)
    assert planner.add("micro", cron("*/5 * * * *"), s(0) + US) == s(300)
    assert planner.add("before", cron("*/5 * * * *"), s(0) - US) == s(0)
    assert planner.add("hourly", cron("0 * * * *"), s(59 * 60 + 59)) == s(3600)


def test_interval_ticks_are_epoch_anchored_not_add_time_anchored() -> None:
    planner = Planner()
    # Added 3.5 s after a grid point: the ticks stay on the 10 s grid of the epoch.
    planner.add("a", every(seconds=10), s(3.5))
    assert planner.upcoming("a", 3) == [s(10), s(20), s(30)]


def test_interval_with_an_explicit_anchor() -> None:
    planner = Planner()
    # Anchor in the future: the anchor itself is the first tick (n = 0).
    planner.add("future", every(seconds=10, anchor=s(95)), s(0))
    assert planner.upcoming("future", 3) == [s(95), s(105), s(115)]
    # Anchor in the past, off the epoch grid.
    planner.add("past", every(seconds=10, anchor=s(-57)), s(0))
    assert planner.upcoming("past", 3) == [s(3), s(13), s(23)]


# ---- start_at ----------------------------------------------------------------------------


def test_start_at_on_a_tick_includes_that_tick() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(0), start_at=s(30)) == s(30)
    assert planner.upcoming("a", 3) == [s(30), s(40), s(50)]


def test_start_at_between_ticks_starts_at_the_next_tick() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(0), start_at=s(25)) == s(30)
    # A microsecond after a tick excludes that tick.
    assert planner.add("b", every(seconds=10), s(0), start_at=s(30) + US) == s(40)
    # A microsecond before a tick includes it.
    assert planner.add("c", every(seconds=10), s(0), start_at=s(30) - US) == s(30)


def test_start_at_one_microsecond_after_now_on_a_tick() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(10) - US, start_at=s(10)) == s(10)


def test_start_at_in_the_past_does_not_plan_ticks_before_now() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(35), start_at=s(0)) == s(40)
    # start_at == now == a tick: the tick is not strictly after now.
    assert planner.add("b", every(seconds=10), s(30), start_at=s(30)) == s(40)


def test_start_at_with_cron() -> None:
    planner = Planner()
    assert planner.add("a", cron("0 * * * *"), s(0), start_at=s(2 * 3600)) == s(2 * 3600)
    assert planner.add("b", cron("0 * * * *"), s(0), start_at=s(2 * 3600) + US) == s(3 * 3600)
    # Sub-second start_at between cron ticks.
    assert planner.add("c", cron("* * * * *"), s(0), start_at=s(60.5)) == s(120)


def test_decide_never_reports_ticks_before_start_at() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0), start_at=s(30))
    assert planner.decide(s(29)).due == []
    decision = planner.decide(s(55))
    assert decision.due == ticks("a", 50)
    assert decision.missed == ticks("a", 30, 40)
    assert decision.wake_at == s(60)


# ---- stop_at -----------------------------------------------------------------------------


def test_stop_at_excludes_the_tick_at_stop_at() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0), stop_at=s(30))
    assert planner.upcoming("a", 10) == [s(10), s(20)]
    planner.add("b", every(seconds=10), s(0), stop_at=s(30) + US)
    assert planner.upcoming("b", 10) == [s(10), s(20), s(30)]


def test_stop_at_before_the_first_tick_plans_nothing() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(0), stop_at=s(10)) is None
    assert planner.add("b", every(seconds=10), s(0), stop_at=s(5)) is None
    assert "a" in planner
    assert planner.next_due("a") is None
    assert planner.upcoming("a", 5) == []
    assert planner.wake_at() is None
    assert planner.decide(s(100)).due == []


def test_stop_at_in_decide_coalesces_only_ticks_before_stop() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0), stop_at=s(30))
    decision = planner.decide(s(100))
    assert decision.due == ticks("a", 20)
    assert decision.missed == ticks("a", 10)
    assert decision.wake_at is None
    assert planner.next_due("a") is None
    assert planner.decide(s(1000)).due == []


def test_stop_at_ends_the_job_after_its_last_tick() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0), stop_at=s(25))
    assert planner.decide(s(10)).due == ticks("a", 10)
    decision = planner.decide(s(20))
    assert decision.due == ticks("a", 20)
    assert decision.wake_at is None
    assert planner.wake_at() is None


def test_start_and_stop_window() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0), start_at=s(20), stop_at=s(50))
    assert planner.upcoming("a", 10) == [s(20), s(30), s(40)]


# ---- after (catch-up origin) -------------------------------------------------------------


def test_after_plans_from_an_earlier_instant() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(100), after=s(35)) == s(40)
    decision = planner.decide(s(100))
    assert decision.due == ticks("a", 100)
    assert decision.missed == ticks("a", 40, 50, 60, 70, 80, 90)
    assert decision.wake_at == s(110)


def test_after_still_respects_start_at() -> None:
    planner = Planner()
    assert planner.add("a", every(seconds=10), s(100), after=s(35), start_at=s(70)) == s(70)


# ---- decide ------------------------------------------------------------------------------


#: One job every 10 s from T0, decided at each ``now`` in turn: (now, due, missed, wake_at),
#: ticks as seconds after T0.
Steps = list[tuple[datetime, list[int], list[int], datetime]]


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([(s(10) - US, [], [], s(10))], id="before-the-first-tick-nothing"),
        pytest.param(
            # Asking again at the same instant reports nothing twice.
            [(s(10), [10], [], s(20)), (s(10), [], [], s(20))],
            id="exactly-at-a-tick-runs-it-once",
        ),
        pytest.param(
            # docs/scheduler.md: a tick due while the scheduler runs is executed however late
            # it is...
            [(s(20) - US, [10], [], s(20))],
            id="a-late-tick-still-runs-when-the-next-is-not-due",
        ),
        pytest.param(
            # ...unless the next tick is already due: decided 35 s after the first tick. Then
            # planning resumes normally after the coalesced tick.
            [(s(10 + 35), [40], [10, 20, 30], s(50)), (s(50), [50], [], s(60))],
            id="coalescing-runs-only-the-latest-due-tick",
        ),
        pytest.param(
            [(s(30), [30], [10, 20], s(40))], id="coalescing-when-now-is-exactly-on-a-tick"
        ),
    ],
)
def test_decide_one_job(steps: Steps) -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    for now, due, missed, wake_at in steps:
        decision = planner.decide(now)
        assert decision.due == ticks("a", *due)
        assert decision.missed == ticks("a", *missed)
        assert decision.older_missed == {}
        assert decision.wake_at == wake_at
        assert planner.next_due("a") == wake_at


def test_decide_across_many_jobs_sorts_due_ticks_by_time() -> None:
    planner = Planner()
    # Added in an order unrelated to their due times.
    planner.add("hourly", every(seconds=100, anchor=T0), s(0))  # 100: not yet due
    planner.add("minute", every(seconds=60, anchor=T0), s(0))  # 60
    planner.add("sevens", every(seconds=7, anchor=T0), s(0))  # 7, 14, ..., 56
    planner.add("cron", cron("* * * * *"), s(0))  # 60
    planner.add("odd", every(seconds=25, anchor=s(1)), s(0))  # 1, 26, 51
    planner.add("once", once(s(5), now=T0), s(0))  # 5
    decision = planner.decide(s(61))
    due_times = [t.scheduled_at for t in decision.due]
    assert due_times == [s(5), s(51), s(56), s(60), s(60)]
    assert decision.due[:3] == [Tick("once", s(5)), Tick("odd", s(51)), Tick("sevens", s(56))]
    assert set(decision.due[3:]) == {Tick("minute", s(60)), Tick("cron", s(60))}
    assert sorted(decision.missed) == sorted(
        ticks("odd", 1, 26) + ticks("sevens", 7, 14, 21, 28, 35, 42, 49)
    )
    assert decision.older_missed == {}
    # Next ticks: hourly 100, minute 120, sevens 63, cron 120, odd 76, once none.
    assert decision.wake_at == s(63)
    assert planner.wake_at() == s(63)
    assert planner.next_due("once") is None
    assert planner.next_due("odd") == s(76)


def test_decide_many_jobs_due_at_the_same_instant() -> None:
    planner = Planner()
    names = [f"job{i}" for i in range(50)]
    for name in names:
        planner.add(name, every(seconds=10), s(0))
    decision = planner.decide(s(10))
    assert sorted(decision.due) == sorted(Tick(name, s(10)) for name in names)
    assert decision.missed == []
    assert decision.wake_at == s(20)


# ---- the enumeration bound ---------------------------------------------------------------


def test_a_week_late_per_second_job_lists_its_latest_misses_and_spans_the_rest() -> None:
    planner = Planner()
    planner.add("fast", every(seconds=1), s(0))
    planner.add("slow", every(days=1), s(0))
    now = s(7 * 86400 + 0.5)
    decision = planner.decide(now)
    fast_missed = [t for t in decision.missed if t.job == "fast"]
    # The latest ones are listed, the older ones one span: every tick exactly once.
    first_listed = 7 * 86400 - MAX_ENUMERATED_TICKS + 1
    assert fast_missed == ticks("fast", *range(first_listed, 7 * 86400))
    assert decision.older_missed == {"fast": Span(s(1), s(first_listed - 1), first_listed - 1)}
    # The job still runs its latest tick; the other job is unaffected (6 missed, day 7 runs).
    assert sorted(decision.due) == [Tick("fast", s(7 * 86400)), Tick("slow", s(7 * 86400))]
    assert sorted(t for t in decision.missed if t.job == "slow") == ticks(
        "slow", *(d * 86400 for d in range(1, 7))
    )
    # Planning resumes at the first tick after now.
    assert planner.next_due("fast") == s(7 * 86400 + 1)
    assert decision.wake_at == s(7 * 86400 + 1)
    assert planner.decide(s(7 * 86400 + 1)).due == [Tick("fast", s(7 * 86400 + 1))]


@pytest.mark.parametrize(
    ("now", "missed", "older"),
    [
        pytest.param(
            # MAX due ticks: MAX - 1 missed, the latest runs.
            MAX_ENUMERATED_TICKS,
            range(1, MAX_ENUMERATED_TICKS),
            None,
            id="exactly-max-due-ticks-are-listed",
        ),
        pytest.param(
            MAX_ENUMERATED_TICKS + 1,
            range(2, MAX_ENUMERATED_TICKS + 1),
            (1, 1, 1),
            id="max-plus-one-due-ticks-span-the-oldest",
        ),
        pytest.param(
            MAX_ENUMERATED_TICKS + 2,
            range(3, MAX_ENUMERATED_TICKS + 2),
            (1, 2, 2),
            id="max-plus-two-due-ticks-span-the-two-oldest",
        ),
    ],
)
def test_the_enumeration_bound_of_a_job_every_second(
    now: int, missed: range, older: tuple[int, int, int] | None
) -> None:
    planner = Planner()
    planner.add("a", every(seconds=1), s(0))
    decision = planner.decide(s(now))
    assert decision.due == [Tick("a", s(now))]
    assert decision.missed == ticks("a", *missed)
    expected = {} if older is None else {"a": Span(s(older[0]), s(older[1]), older[2])}
    assert decision.older_missed == expected
    assert decision.wake_at == s(now + 1)


# ---- wake_at -----------------------------------------------------------------------------


def test_wake_at_is_the_earliest_next_tick_across_jobs() -> None:
    planner = Planner()
    assert planner.wake_at() is None
    planner.add("a", every(seconds=60), s(0))
    assert planner.wake_at() == s(60)
    planner.add("b", every(seconds=7, anchor=s(2)), s(0))
    assert planner.wake_at() == s(2)
    planner.add("c", cron("0 * * * *"), s(0))
    assert planner.wake_at() == s(2)
    assert planner.decide(s(2)).wake_at == s(9)
    assert planner.wake_at() == s(9)
    # Removing the earliest job moves wake_at to the next one.
    planner.remove("b")
    assert planner.wake_at() == s(60)


def test_wake_at_is_none_once_every_job_is_finished() -> None:
    planner = Planner()
    planner.add("one", once(s(5), now=T0), s(0))
    planner.add("window", every(seconds=10), s(0), stop_at=s(15))
    assert planner.wake_at() == s(5)
    assert planner.decide(s(5)).wake_at == s(10)
    decision = planner.decide(s(10))
    assert decision.due == ticks("window", 10)
    assert decision.wake_at is None
    assert planner.wake_at() is None
    # The jobs are still registered, only finished.
    assert len(planner) == 2
    assert planner.next_due("one") is None
    assert planner.next_due("window") is None
    assert planner.decide(s(10_000)).due == []


def test_wake_at_none_for_a_one_time_job_added_after_its_instant() -> None:
    planner = Planner()
    assert planner.add("late", once(s(5), now=T0), s(6)) is None
    assert planner.wake_at() is None
    # Added exactly at its instant: the first tick must be strictly after now.
    assert planner.add("exact", once(s(5), now=T0), s(5)) is None
    assert planner.wake_at() is None


def test_wake_at_none_when_stop_at_has_passed() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(100), stop_at=s(50))
    assert planner.wake_at() is None
    assert planner.decide(s(200)).wake_at is None


# ---- remove and re-add -------------------------------------------------------------------


def test_remove() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.add("b", every(seconds=15), s(0))
    assert planner.remove("a") is True
    assert planner.remove("a") is False
    assert planner.remove("never") is False
    assert "a" not in planner
    assert len(planner) == 1
    assert planner.next_due("a") is None
    assert planner.upcoming("a", 3) == []
    assert planner.wake_at() == s(15)
    decision = planner.decide(s(100))
    assert all(t.job == "b" for t in decision.due + decision.missed)
    assert decision.due == ticks("b", 90)


def test_removing_the_only_job_leaves_nothing_to_wake_for() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.remove("a")
    assert planner.wake_at() is None
    decision = planner.decide(s(100))
    assert decision.due == []
    assert decision.missed == []
    assert decision.wake_at is None


def test_re_adding_replaces_the_plan() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    assert planner.add("a", every(seconds=7, anchor=T0), s(0)) == s(7)
    assert len(planner) == 1
    assert planner.upcoming("a", 3) == [s(7), s(14), s(21)]
    # The old plan's ticks (10, 20, 30) never surface.
    assert planner.decide(s(10)).due == ticks("a", 7)
    assert planner.decide(s(20)).due == ticks("a", 14)
    decision = planner.decide(s(30))
    assert decision.due == ticks("a", 28)
    assert decision.missed == ticks("a", 21)
    assert decision.wake_at == s(35)


def test_stale_entries_never_surface_in_decide_or_wake_at() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))  # old plan: 10
    planner.add("a", every(seconds=60), s(0))  # new plan: 60
    assert planner.wake_at() == s(60)
    decision = planner.decide(s(30))
    assert decision.due == []
    assert decision.missed == []
    assert decision.wake_at == s(60)
    assert planner.decide(s(60)).due == ticks("a", 60)


def test_re_adding_with_a_later_start_replaces_the_plan() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.add("a", every(seconds=10), s(0), start_at=s(100))
    assert planner.wake_at() == s(100)
    assert planner.decide(s(99)).due == []
    assert planner.decide(s(100)).due == ticks("a", 100)


def test_re_adding_with_stop_at_in_the_past_finishes_the_job() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.add("a", every(seconds=10), s(0), stop_at=s(5))
    assert planner.wake_at() is None
    assert planner.decide(s(100)).due == []


def test_remove_then_re_add_never_duplicates_a_tick() -> None:
    # After remove + add, the generation restarts; a stale entry with the same generation
    # and time as the live one must still not produce a second run of that tick.
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.remove("a")
    planner.add("a", every(seconds=10), s(0))
    planner.remove("a")
    planner.add("a", every(seconds=5, anchor=T0), s(0))
    seen: list[Tick] = []
    for x in range(1, 61):
        decision = planner.decide(s(x))
        seen.extend(decision.due)
        assert decision.missed == []
    assert seen == ticks("a", *range(5, 61, 5))


def test_re_add_many_times_then_decide_once() -> None:
    planner = Planner()
    for i in range(20):
        planner.add("a", every(seconds=10 + i), s(0))
    # Only the last plan counts: every 29 s from the epoch; T0 sits `offset` s past its grid.
    offset = (T0 - z(1970, 1, 1)) // timedelta(seconds=1) % 29
    first = 29 - offset
    decision = planner.decide(s(first))
    assert decision.due == ticks("a", first)
    assert decision.missed == []
    assert decision.wake_at == s(first + 29)


# ---- upcoming ----------------------------------------------------------------------------


def test_upcoming() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    assert planner.upcoming("a", 3) == [s(10), s(20), s(30)]
    assert planner.upcoming("a", 0) == []
    # It is a view: it does not consume ticks.
    assert planner.upcoming("a", 1) == [s(10)]
    assert planner.next_due("a") == s(10)
    planner.decide(s(25))
    assert planner.upcoming("a", 2) == [s(30), s(40)]


def test_upcoming_respects_stop_at() -> None:
    planner = Planner()
    planner.add("a", cron("0 * * * *"), s(0), stop_at=s(3 * 3600))
    assert planner.upcoming("a", 10) == [s(3600), s(2 * 3600)]


def test_upcoming_of_a_one_time_job() -> None:
    planner = Planner()
    planner.add("a", once(s(30), s(10), s(20), now=T0), s(0))
    assert planner.upcoming("a", 10) == [s(10), s(20), s(30)]
    planner.decide(s(15))
    assert planner.upcoming("a", 10) == [s(20), s(30)]


# ---- one-time triggers -------------------------------------------------------------------


def test_one_time_job_runs_each_instant_once() -> None:
    planner = Planner()
    planner.add("a", once(s(5), s(15), now=T0), s(0))
    assert planner.wake_at() == s(5)
    assert planner.decide(s(4)).due == []
    first = planner.decide(s(5))
    assert first.due == ticks("a", 5)
    assert first.wake_at == s(15)
    second = planner.decide(s(16))
    assert second.due == ticks("a", 15)
    assert second.missed == []
    assert second.wake_at is None
    assert planner.decide(s(1000)).due == []


def test_one_time_job_with_both_instants_due_coalesces() -> None:
    planner = Planner()
    planner.add("a", once(s(5), s(15), now=T0), s(0))
    decision = planner.decide(s(20))
    assert decision.due == ticks("a", 15)
    assert decision.missed == ticks("a", 5)
    assert decision.wake_at is None


def test_one_time_job_respects_start_and_stop() -> None:
    planner = Planner()
    planner.add("a", once(s(5), s(15), s(25), now=T0), s(0), start_at=s(10), stop_at=s(25))
    assert planner.upcoming("a", 10) == [s(15)]


# ---- catch_up_plan -----------------------------------------------------------------------
# Every 10 s; the last recorded tick is 10 s, the replica comes back at 45 s:
# the ticks that fell due in (10, 45] are 20, 30 and 40 (age 5 s at 45 s).

TEN = every(seconds=10)


@pytest.mark.parametrize(
    ("policy", "grace", "run", "missed"),
    [
        ("latest", None, [40], [20, 30]),
        ("latest", timedelta(seconds=10), [40], [20, 30]),
        ("latest", timedelta(seconds=5) + US, [40], [20, 30]),
        ("latest", timedelta(seconds=5) - US, [], [20, 30, 40]),
        ("latest", timedelta(seconds=3), [], [20, 30, 40]),
        ("latest", timedelta(0), [], [20, 30, 40]),
        ("none", None, [], [20, 30, 40]),
        ("none", timedelta(seconds=10), [], [20, 30, 40]),
        ("all", None, [20, 30, 40], []),
        # Grace applies to "latest" only (docs/scheduler.md, catch_up_plan docstring).
        ("all", timedelta(seconds=3), [20, 30, 40], []),
    ],
)
def test_catch_up_policies(
    policy: str, grace: timedelta | None, run: list[int], missed: list[int]
) -> None:
    assert policy in ("latest", "none", "all")
    result = catch_up_plan(TEN, s(10), s(45), policy, grace)  # type: ignore[arg-type]
    assert result == ([s(x) for x in run], [s(x) for x in missed], None)


def test_catch_up_latest_tick_exactly_grace_old_is_run() -> None:
    # Grace is inclusive: a tick at most `grace` old still runs.
    result = catch_up_plan(TEN, s(10), s(45), "latest", timedelta(seconds=5))
    assert result == ([s(40)], [s(20), s(30)], None)
    too_old = catch_up_plan(TEN, s(10), s(45), "latest", timedelta(seconds=5) - US)
    assert too_old == ([], [s(20), s(30), s(40)], None)


@pytest.mark.parametrize("policy", ["latest", "none", "all"])
@pytest.mark.parametrize("grace", [None, timedelta(seconds=1)])
def test_catch_up_without_missed_ticks_does_nothing(policy: str, grace: timedelta | None) -> None:
    assert policy in ("latest", "none", "all")
    nothing: tuple[list[datetime], list[datetime], None] = ([], [], None)
    assert catch_up_plan(TEN, s(40), s(45), policy, grace) == nothing  # type: ignore[arg-type]
    assert catch_up_plan(TEN, s(40), s(40), policy, grace) == nothing  # type: ignore[arg-type]
    assert catch_up_plan(TEN, s(40), s(50) - US, policy, grace) == nothing  # type: ignore[arg-type]


def test_catch_up_includes_a_tick_exactly_at_now_and_excludes_last_tick() -> None:
    assert catch_up_plan(TEN, s(40), s(50), "latest", None) == ([s(50)], [], None)
    assert catch_up_plan(TEN, s(40), s(50), "all", None) == ([s(50)], [], None)
    assert catch_up_plan(TEN, s(40), s(50), "none", None) == ([], [s(50)], None)


def test_catch_up_latest_with_a_single_missed_tick_and_grace() -> None:
    assert catch_up_plan(TEN, s(40), s(52), "latest", timedelta(seconds=3)) == (
        [s(50)],
        [],
        None,
    )
    assert catch_up_plan(TEN, s(40), s(54), "latest", timedelta(seconds=3)) == (
        [],
        [s(50)],
        None,
    )


def test_catch_up_of_a_finished_one_time_trigger() -> None:
    trigger = once(s(5), s(15), now=T0)
    assert catch_up_plan(trigger, s(5), s(100), "latest", None) == ([s(15)], [], None)
    assert catch_up_plan(trigger, s(0), s(100), "all", None) == ([s(5), s(15)], [], None)
    assert catch_up_plan(trigger, s(15), s(100), "latest", None) == ([], [], None)


ONE = every(seconds=1)
FIRST_MAX = [s(x) for x in range(1, MAX_ENUMERATED_TICKS + 1)]


def test_catch_up_exactly_max_ticks_is_listed_whole() -> None:
    now = s(MAX_ENUMERATED_TICKS)
    assert catch_up_plan(ONE, s(0), now, "all", None) == (FIRST_MAX, [], None)
    assert catch_up_plan(ONE, s(0), now, "none", None) == ([], FIRST_MAX, None)
    assert catch_up_plan(ONE, s(0), now, "latest", None) == (
        [now],
        FIRST_MAX[:-1],
        None,
    )


@pytest.mark.parametrize("trigger", [ONE, cron("* * * * * *", seconds=True)], ids=["every", "cron"])
@pytest.mark.parametrize("behind", [MAX_ENUMERATED_TICKS + 1, 2 * 3600])
def test_catch_up_past_the_bound_lists_the_latest_ticks_and_spans_the_older_ones(
    trigger: Trigger, behind: int
) -> None:
    now = s(behind + 0.5)
    latest = [s(x) for x in range(behind - MAX_ENUMERATED_TICKS + 1, behind + 1)]
    older = Span(s(1), s(behind - MAX_ENUMERATED_TICKS), behind - MAX_ENUMERATED_TICKS)
    assert catch_up_plan(trigger, s(0), now, "all", None) == (latest, [], older)
    assert catch_up_plan(trigger, s(0), now, "none", None) == ([], latest, older)
    assert catch_up_plan(trigger, s(0), now, "latest", timedelta(seconds=1)) == (
        latest[-1:],
        latest[:-1],
        older,
    )
    assert catch_up_plan(trigger, s(0), now, "latest", US) == ([], latest, older)


def test_a_span_and_the_listed_ticks_cover_every_tick_once() -> None:
    now = s(7 * 86400 + 0.5)
    run, missed, older = catch_up_plan(ONE, s(0), now, "latest", None)
    assert run == [s(7 * 86400)]
    assert len(missed) == MAX_ENUMERATED_TICKS - 1
    assert older is not None
    assert older.ticks + len(missed) + len(run) == 7 * 86400
    assert older.last + timedelta(seconds=1) == missed[0]


# ---- overlap_action ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "running", "action"),
    [
        ("skip", 0, "run"),
        ("skip", 1, "skip"),
        ("skip", 3, "skip"),
        ("queue", 0, "run"),
        ("queue", 1, "queue"),
        ("queue", 2, "queue"),
        ("allow", 0, "run"),
        ("allow", 1, "run"),
        ("allow", 5, "run"),
    ],
)
def test_overlap_action(policy: str, running: int, action: str) -> None:
    assert policy in ("skip", "queue", "allow")
    assert overlap_action(policy, running) == action  # type: ignore[arg-type]


# ---- property: nothing lost, nothing duplicated ------------------------------------------

MICROS_PER_SECOND = 1_000_000


@dataclass(frozen=True)
class JobPlan:
    name: str
    anchor_us: int  # relative to T0
    interval_us: int
    start_us: int | None  # relative to T0
    stop_us: int | None  # relative to T0

    def ticks_in(self, lo_us: int, hi_us: int) -> list[int]:
        """Ticks anchor + k * interval (k >= 0) in (lo, hi], within [start, stop)."""
        k = max(0, (lo_us - self.anchor_us) // self.interval_us + 1)
        found = []
        while (tick := self.anchor_us + k * self.interval_us) <= hi_us:
            in_start = self.start_us is None or tick >= self.start_us
            in_stop = self.stop_us is None or tick < self.stop_us
            if in_start and in_stop:
                found.append(tick)
            k += 1
        return found


def at_us(micros: int) -> datetime:
    return T0 + timedelta(microseconds=micros)


@st.composite
def job_plans(draw: st.DrawFn) -> list[JobPlan]:
    count = draw(st.integers(1, 5))
    plans = []
    for i in range(count):
        interval = draw(st.integers(1, 60)) * MICROS_PER_SECOND + draw(
            st.sampled_from([0, 0, 1, 250_000])
        )
        plans.append(
            JobPlan(
                name=f"job{i}",
                anchor_us=draw(st.integers(-200, 200)) * MICROS_PER_SECOND
                + draw(st.integers(0, MICROS_PER_SECOND - 1)),
                interval_us=interval,
                start_us=draw(st.none() | st.integers(0, 600 * MICROS_PER_SECOND)),
                stop_us=draw(st.none() | st.integers(0, 3000 * MICROS_PER_SECOND)),
            )
        )
    return plans


# Each gap between decide() calls is at most 300 s and every interval at least 1 s, so no
# job can fall more than MAX_ENUMERATED_TICKS behind: nothing is spanned.
GAPS = st.lists(
    st.integers(0, 300 * MICROS_PER_SECOND)
    | st.integers(0, 300).map(lambda x: x * MICROS_PER_SECOND),
    min_size=1,
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(plans=job_plans(), add_us=st.integers(0, 100 * MICROS_PER_SECOND), gaps=GAPS)
def test_every_tick_is_reported_exactly_once(
    plans: list[JobPlan], add_us: int, gaps: list[int]
) -> None:
    assert MAX_ENUMERATED_TICKS > 300
    planner = Planner()
    for plan in plans:
        planner.add(
            plan.name,
            every(timedelta(microseconds=plan.interval_us), anchor=at_us(plan.anchor_us)),
            at_us(add_us),
            start_at=None if plan.start_us is None else at_us(plan.start_us),
            stop_at=None if plan.stop_us is None else at_us(plan.stop_us),
        )
    reported: Counter[Tick] = Counter()
    previous = add_us
    for gap in gaps:
        now_us = previous + gap
        now = at_us(now_us)
        decision = planner.decide(now)
        assert decision.older_missed == {}
        # Due ticks are never in the future, sorted by time, at most one per job.
        assert all(t.scheduled_at <= now for t in decision.due)
        assert all(t.scheduled_at <= now for t in decision.missed)
        due_times = [t.scheduled_at for t in decision.due]
        assert due_times == sorted(due_times)
        assert len({t.job for t in decision.due}) == len(decision.due)
        for plan in plans:
            expected = plan.ticks_in(previous, now_us)
            due = [t.scheduled_at for t in decision.due if t.job == plan.name]
            missed = sorted(t.scheduled_at for t in decision.missed if t.job == plan.name)
            # Exactly the ticks in (previous now, now]: the latest runs, the rest are missed.
            assert due == [at_us(x) for x in expected[-1:]]
            assert missed == [at_us(x) for x in expected[:-1]]
        # wake_at is the earliest tick after now across jobs (None if there is none).
        # A job that is not stopped has a tick within 3000 s (interval <= 61 s, anchor and
        # start_at <= 600 s after T0), so an empty horizon means every job is finished.
        horizon = now_us + 3000 * MICROS_PER_SECOND
        following = [t for plan in plans for t in plan.ticks_in(now_us, horizon)]
        expected_wake = at_us(min(following)) if following else None
        assert decision.wake_at == expected_wake
        assert planner.wake_at() == expected_wake
        reported.update(decision.due)
        reported.update(decision.missed)
        previous = now_us
    # Over the whole window: every tick of every job exactly once.
    assert all(count == 1 for count in reported.values())
    assert set(reported) == {
        Tick(plan.name, at_us(t)) for plan in plans for t in plan.ticks_in(add_us, previous)
    }


# ---- prepare: the next instant worked out while idle -------------------------------------


def test_prepare_keeps_next_due_upcoming_and_decide_unchanged() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.add("b", every(seconds=15), s(0))
    assert planner.prepare() == 1  # only "a" is due at the earliest instant, s(10)
    assert planner.next_due("a") == s(10)
    assert planner.upcoming("a", 3) == [s(10), s(20), s(30)]
    assert planner.wake_at() == s(10)
    assert planner.prepare() == 0  # nothing new at s(10)
    planner.add("c", every(seconds=5), s(5))  # due at s(10) too: joins the prepared ones
    assert planner.prepare() == 1
    decision = planner.decide(s(10))
    assert decision.due == [Tick("a", s(10)), Tick("c", s(10))]
    assert decision.missed == []
    assert decision.wake_at == s(15)


def test_prepared_tick_is_coalesced_on_a_late_wake_up() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.prepare()
    decision = planner.decide(s(25))
    assert decision.due == [Tick("a", s(20))]
    assert decision.missed == [Tick("a", s(10))]


def test_replanning_or_removing_drops_the_prepared_tick() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.add("b", every(seconds=10), s(0))
    planner.prepare()
    planner.add("a", every(seconds=7), s(3))  # re-planned from s(3): first tick s(7)
    planner.remove("b")
    assert planner.next_due("b") is None
    assert planner.decide(s(10)).due == [Tick("a", s(7))]
    assert planner.decide(s(14)).due == [Tick("a", s(14))]


def test_an_early_decide_leaves_the_prepared_ticks_alone() -> None:
    planner = Planner()
    planner.add("a", every(seconds=10), s(0))
    planner.prepare()
    assert planner.decide(s(5)).due == []
    assert planner.decide(s(10)).due == [Tick("a", s(10))]
