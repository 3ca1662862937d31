"""every(): anchored intervals, jitter, random intervals."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from replicron import (
    IntervalTrigger,
    InvalidIntervalError,
    InvalidJobNameError,
    InvalidJobOptionError,
    NaiveDatetimeError,
    ReplicronError,
    Scheduler,
    after,
    every,
    upcoming,
)
from tests.helpers import z


def test_ticks_are_anchored_at_the_epoch_not_at_the_first_call() -> None:
    trigger = every(seconds=7)
    # 2026-01-01T00:00:00Z is 1767225600 s after the epoch, which is 7 * 252460800.
    assert (z(2026, 1, 1) - z(1970, 1, 1)).total_seconds() == 7 * 252460800
    assert trigger.next_after(z(2026, 1, 1)) == z(2026, 1, 1, 0, 0, 7)
    assert trigger.next_after(z(2026, 1, 1, 0, 0, 3)) == z(2026, 1, 1, 0, 0, 7)
    # Two "replicas" asking at different moments agree on the grid.
    a = list(upcoming(trigger, z(2026, 1, 1, 0, 0, 1), 3))
    b = list(upcoming(trigger, z(2026, 1, 1, 0, 0, 6, 999999), 3))
    assert a == b == [z(2026, 1, 1, 0, 0, 7), z(2026, 1, 1, 0, 0, 14), z(2026, 1, 1, 0, 0, 21)]


def test_forms_of_the_interval_are_equivalent() -> None:
    start = z(2026, 5, 5, 12, 34, 56)
    forms = [
        every(timedelta(minutes=90)),
        every(minutes=90),
        every(hours=1.5),
        every(seconds=5400),
        every(hours=1, minutes=30),
    ]
    assert {f.next_after(start) for f in forms} == {z(2026, 5, 5, 13, 30)}
    assert every(days=1).next_after(start) == z(2026, 5, 6)


def test_sub_second_interval() -> None:
    trigger = every(timedelta(milliseconds=250))
    assert trigger.next_after(z(2026, 1, 1, 0, 0, 0)) == datetime(
        2026, 1, 1, 0, 0, 0, 250000, tzinfo=UTC
    )


def test_explicit_anchor_is_the_first_tick() -> None:
    anchor = datetime(2026, 6, 1, 9, 0, tzinfo=timezone(timedelta(hours=2)))  # 07:00Z
    trigger = every(hours=2, anchor=anchor)
    assert trigger.next_after(z(2020, 1, 1)) == z(2026, 6, 1, 7)
    assert trigger.next_after(z(2026, 6, 1, 7)) == z(2026, 6, 1, 9)
    assert trigger.next_after(z(2026, 6, 2, 8, 59)) == z(2026, 6, 2, 9)


def test_interval_ignores_dst() -> None:
    # 2026-03-08 is a 23-hour day in New York; an interval counts real time regardless.
    trigger = every(hours=6)
    new_york = datetime(2026, 3, 8, tzinfo=timezone(timedelta(hours=-5)))
    assert list(upcoming(trigger, new_york, 3)) == [
        z(2026, 3, 8, 6),
        z(2026, 3, 8, 12),
        z(2026, 3, 8, 18),
    ]


def test_jitter_is_repeatable_bounded_and_keyed_by_job_name() -> None:
    base = every(minutes=10, jitter=timedelta(minutes=3))
    a, b = base.for_job("report"), base.for_job("report")
    other = base.for_job("cleanup")
    start = z(2026, 1, 1)
    ticks_a = list(upcoming(a, start, 200))
    assert ticks_a == list(upcoming(b, start, 200))
    assert ticks_a != list(upcoming(other, start, 200))
    # The slot at `start` itself is jittered forward, so it is the first tick after `start`.
    grid = [start + timedelta(minutes=10 * k) for k in range(200)]
    for tick, slot in zip(ticks_a, grid, strict=True):
        assert slot <= tick < slot + timedelta(minutes=3)
    offsets = {tick - slot for tick, slot in zip(ticks_a, grid, strict=True)}
    assert len(offsets) > 150  # actually spread, not constant
    assert a.key == "report"
    assert base.key == ""


def test_random_interval_gaps_stay_within_bounds_and_replicas_agree() -> None:
    low, high = timedelta(seconds=30), timedelta(seconds=90)
    trigger = every(between=(low, high)).for_job("poll")
    start = z(2026, 1, 1)
    ticks = [start, *upcoming(trigger, start, 500)]
    gaps = [b - a for a, b in itertools.pairwise(ticks[1:])]
    assert all(low <= gap <= high for gap in gaps)
    assert len(set(gaps)) > 100
    mean = sum(gaps, timedelta()) / len(gaps)
    assert abs(mean - timedelta(seconds=60)) < timedelta(seconds=1)
    # A replica starting at any point in between sees the same ticks.
    later = ticks[137] + (ticks[138] - ticks[137]) / 3
    assert list(upcoming(trigger, later, 20)) == ticks[138:158]


def test_naive_instant_is_rejected() -> None:
    with pytest.raises(NaiveDatetimeError, match="no time zone"):
        every(seconds=1).next_after(datetime(2026, 1, 1))
    with pytest.raises(TypeError):
        every(seconds=1).next_after(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs an interval"),
        ({"seconds": 0}, "needs an interval"),
        ({"seconds": -5}, "must be positive"),
        ({"minutes": -1, "seconds": 30}, "must be positive"),
        ({"seconds": 10, "jitter": timedelta(seconds=10)}, "shorter than the interval"),
        ({"seconds": 10, "jitter": timedelta(seconds=-1)}, "must not be negative"),
        ({"seconds": 10, "jitter": "soon"}, "jitter must be a timedelta"),
        ({"between": (10, 10)}, "must be less than max"),
        ({"between": (20, 10)}, "must be less than max"),
        ({"between": (0, 10)}, "must be positive"),
        ({"between": (-1, 10)}, "must be positive"),
        ({"between": 5}, "must be a pair"),
        ({"between": (1, 2, 3)}, "must be a pair"),
        ({"between": (1, 5), "seconds": 3}, "give it alone"),
        ({"seconds": float("nan")}, "seconds must be a finite number"),
        ({"minutes": float("inf")}, "minutes must be a finite number"),
        ({"days": 1e12}, "longer than a timedelta can hold"),
        ({"seconds": 1e20}, "longer than a timedelta can hold"),
        ({"seconds": True}, "seconds must be a timedelta or a number"),
        ({"seconds": "5"}, "seconds must be a timedelta or a number"),
        ({"seconds": 10, "jitter": float("nan")}, "jitter must be a finite number"),
        ({"seconds": 10, "jitter": 1e20}, "longer than a timedelta can hold"),
        ({"between": (1, float("inf"))}, "between max must be a finite number"),
    ],
)
def test_bad_intervals_fail_at_construction(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidIntervalError, match=message) as info:
        every(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ReplicronError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: after(seconds=-1), "interval must be positive, got -1s"),
        (lambda: every(timedelta(minutes=-5)), "interval must be positive, got -5m"),
        (lambda: every(hours=-1.5), "interval must be positive, got -1h30m"),
        (lambda: every(days=-2, seconds=-0.5), "interval must be positive, got -2d500ms"),
        (lambda: every(seconds=10, jitter=-2), "jitter must not be negative, got -2s"),
        (
            lambda: every(seconds=10, jitter=90),
            "jitter 1m30s must be shorter than the interval 10s",
        ),
        (lambda: every(between=(-1, 5)), "between min must be positive, got -1s"),
        (lambda: every(between=(10, 5.5)), "between min 10s must be less than max 5.5s"),
    ],
)
def test_duration_messages_say_the_duration_as_given(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(InvalidIntervalError) as info:
        make()
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"timeout": -1}, "job 'j': timeout must be positive, not -1s"),
        (
            {"misfire_grace": timedelta(minutes=-2)},
            "job 'j': misfire_grace must be positive, not -2m",
        ),
    ],
)
def test_job_duration_options_say_the_duration_as_given(
    option: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidJobOptionError) as info:
        Scheduler().add_job(every(seconds=5), print, name="j", **option)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_bad_positional_interval() -> None:
    with pytest.raises(InvalidIntervalError, match=r"every\(seconds=\.\.\.\)"):
        every(30)  # type: ignore[arg-type]
    with pytest.raises(InvalidIntervalError, match="not both"):
        every(timedelta(seconds=3), seconds=3)
    with pytest.raises(InvalidIntervalError, match="must be positive"):
        every(timedelta(0))


def test_naive_anchor_is_rejected() -> None:
    with pytest.raises(NaiveDatetimeError):
        every(seconds=5, anchor=datetime(2026, 1, 1))


def test_for_job_validates_the_name() -> None:
    with pytest.raises(InvalidJobNameError, match="empty"):
        every(seconds=5).for_job("")


def test_trigger_is_immutable_comparable_and_readable() -> None:
    trigger = every(minutes=5, jitter=timedelta(seconds=3))
    assert isinstance(trigger, IntervalTrigger)
    with pytest.raises(AttributeError):
        trigger.key = "x"
    assert trigger == every(seconds=300, jitter=timedelta(seconds=3))
    assert hash(trigger) == hash(every(seconds=300, jitter=timedelta(seconds=3)))
    assert trigger != trigger.for_job("a")
    assert repr(trigger) == "every(timedelta(seconds=300), jitter=timedelta(seconds=3))"
    assert trigger.interval == timedelta(minutes=5)


@pytest.mark.parametrize(
    ("trigger", "text"),
    [
        (every(seconds=5), "every 5s"),
        (every(minutes=90), "every 1h30m"),
        (every(days=1, seconds=0.5), "every 1d500ms"),
        (every(seconds=90, jitter=10), "every 1m30s, jitter 10s"),
        (every(between=(60, 300)), "every 1m to 5m"),
        (every(hours=1, anchor=z(2026, 1, 1, 0, 7)), "every 1h, from 2026-01-01T00:07:00+00:00"),
        (every(timedelta(microseconds=1500)), "every 0.0015s"),
        (after(minutes=5), "after 5m"),
    ],
)
def test_str_says_the_interval_as_a_config_writes_it(trigger: object, text: str) -> None:
    assert str(trigger) == text
    assert repr(trigger) != text  # code to rebuild it, for the fingerprint and debugging
