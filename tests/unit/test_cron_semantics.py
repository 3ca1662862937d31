"""Cron meaning in UTC (docs/cron.md): Debian's day rule, ``L`` and ``#``, the seconds field,
descriptors, and ``next_after`` being strictly after.

Expected fire times never come from replicron: they are written out by hand or found by
``brute``, which walks candidate instants one step at a time and checks each with a plain
Python predicate. Field syntax and rejections are in ``test_cron_parse.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replicron
from replicron import cron, upcoming
from tests.helpers import brute
from tests.helpers import z as utc

Pred = Callable[[datetime], bool]
SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


def dow(d: datetime) -> int:
    """Cron's weekday number: Sunday = 0, Monday = 1 ... Saturday = 6."""
    return d.isoweekday() % 7


def last_day(d: datetime) -> bool:
    return (d + DAY).day == 1


def nth(d: datetime) -> int:
    """Which occurrence of its weekday in the month ``d`` is (1 for days 1-7 ...)."""
    return (d.day - 1) // 7 + 1


def fires(expression: str, after: datetime, count: int, *, seconds: bool = False) -> list[datetime]:
    return list(upcoming(cron(expression, seconds=seconds), after, count))


# --- Debian's day rule: '*' at the start of either day field's text means AND, else OR -------

DAY_START = utc(2023, 12, 31)  # a Sunday

DAY_RULE_CASES: list[tuple[str, Pred]] = [
    ("0 0 */2 * 1", lambda d: d.day % 2 == 1 and dow(d) == 1),
    ("0 0 1-7 * 1", lambda d: d.day <= 7 or dow(d) == 1),
    ("0 0 * * 1", lambda d: dow(d) == 1),
    ("0 0 13 * 5", lambda d: d.day == 13 or dow(d) == 5),
    ("0 0 1 * *", lambda d: d.day == 1),
    ("0 0 */1 * 1", lambda d: dow(d) == 1),  # starts with '*': AND with every day
    ("0 0 1-31 * 1", lambda d: True),  # no '*': OR with every day
    ("0 0 1 * */2", lambda d: d.day == 1 and dow(d) in {0, 2, 4, 6}),
    ("0 0 1 * 0-7", lambda d: True),
    ("0 0 1,15 * mon", lambda d: d.day in {1, 15} or dow(d) == 1),
    ("0 0 */15 * fri", lambda d: d.day in {1, 16, 31} and dow(d) == 5),
    ("0 0 * jan,jul mon", lambda d: d.month in {1, 7} and dow(d) == 1),
    ("0 0 10-12 2 sat", lambda d: d.month == 2 and (10 <= d.day <= 12 or dow(d) == 6)),
    # L in day-of-month
    ("0 0 L * *", last_day),
    ("0 0 1,L * *", lambda d: d.day == 1 or last_day(d)),
    ("0 0 15,L * *", lambda d: d.day == 15 or last_day(d)),
    ("0 0 L 2 *", lambda d: d.month == 2 and last_day(d)),
    ("0 0 L * 5", lambda d: last_day(d) or dow(d) == 5),
    ("0 0 L * */2", lambda d: last_day(d) and dow(d) in {0, 2, 4, 6}),
    # '#' in day-of-week
    ("0 0 * * mon#1", lambda d: dow(d) == 1 and nth(d) == 1),
    ("0 0 * * MON#1", lambda d: dow(d) == 1 and nth(d) == 1),
    ("0 0 * * 5#3", lambda d: dow(d) == 5 and nth(d) == 3),
    ("0 0 * * sun#5", lambda d: dow(d) == 0 and nth(d) == 5),
    ("0 0 * * 7#1", lambda d: dow(d) == 0 and nth(d) == 1),
    ("0 0 * * 0#1", lambda d: dow(d) == 0 and nth(d) == 1),
    ("0 0 * * mon#1,fri", lambda d: (dow(d) == 1 and nth(d) == 1) or dow(d) == 5),
    ("0 0 * * tue#2,tue#4", lambda d: dow(d) == 2 and nth(d) in {2, 4}),
    ("0 0 1 * mon#2", lambda d: d.day == 1 or (dow(d) == 1 and nth(d) == 2)),
    ("0 0 L * fri#1", lambda d: last_day(d) or (dow(d) == 5 and nth(d) == 1)),
]


@pytest.mark.parametrize(
    ("expression", "pred"), [pytest.param(e, p, id=e) for e, p in DAY_RULE_CASES]
)
def test_day_rule_against_reference(expression: str, pred: Pred) -> None:
    expected = brute(pred, DAY_START, 15, DAY)
    assert fires(expression, DAY_START, 15) == expected


HAND_WRITTEN: list[tuple[str, datetime, list[datetime]]] = [
    # Mondays with an odd date
    (
        "0 0 */2 * 1",
        DAY_START,
        [utc(2024, 1, 1), utc(2024, 1, 15), utc(2024, 1, 29), utc(2024, 2, 5), utc(2024, 2, 19)],
    ),
    # days 1-7 plus every Monday, not "the first Monday"
    (
        "0 0 1-7 * 1",
        DAY_START,
        [utc(2024, 1, d) for d in (1, 2, 3, 4, 5, 6, 7, 8, 15, 22, 29)]
        + [utc(2024, 2, 1), utc(2024, 2, 2)],
    ),
    ("0 0 * * 1", DAY_START, [utc(2024, 1, 1), utc(2024, 1, 8), utc(2024, 1, 15)]),
    # the 13th or any Friday (Jan 13th 2024 is a Saturday, Feb 13th a Tuesday)
    (
        "0 0 13 * 5",
        DAY_START,
        [utc(2024, 1, d) for d in (5, 12, 13, 19, 26)] + [utc(2024, 2, d) for d in (2, 9, 13, 16)],
    ),
    (
        "0 0 L * *",
        utc(2022, 12, 31, 12),
        [utc(2023, 1, 31), utc(2023, 2, 28), utc(2023, 3, 31), utc(2023, 4, 30)],
    ),
    ("0 0 L * *", utc(2024, 1, 1), [utc(2024, 1, 31), utc(2024, 2, 29), utc(2024, 3, 31)]),
    (
        "0 0 L 2 *",
        utc(2023, 1, 1),
        [
            utc(2023, 2, 28),
            utc(2024, 2, 29),
            utc(2025, 2, 28),
            utc(2026, 2, 28),
            utc(2027, 2, 28),
            utc(2028, 2, 29),
        ],
    ),
    ("0 0 L 2 *", utc(1999, 6, 1), [utc(2000, 2, 29), utc(2001, 2, 28)]),
    ("0 0 L 2 *", utc(2099, 6, 1), [utc(2100, 2, 28), utc(2101, 2, 28)]),
    (
        "30 12 L * *",
        utc(2024, 1, 31, 12, 30),
        [utc(2024, 2, 29, 12, 30), utc(2024, 3, 31, 12, 30), utc(2024, 4, 30, 12, 30)],
    ),
    ("0 0 1,L * *", utc(2024, 2, 1), [utc(2024, 2, 29), utc(2024, 3, 1), utc(2024, 3, 31)]),
    (
        "0 0 * * mon#1",
        DAY_START,
        [utc(2024, 1, 1), utc(2024, 2, 5), utc(2024, 3, 4), utc(2024, 4, 1)],
    ),
    (
        "0 0 * * 5#3",
        DAY_START,
        [utc(2024, 1, 19), utc(2024, 2, 16), utc(2024, 3, 15), utc(2024, 4, 19)],
    ),
    # months without a fifth Sunday are skipped
    (
        "0 0 * * sun#5",
        DAY_START,
        [utc(2024, 3, 31), utc(2024, 6, 30), utc(2024, 9, 29), utc(2024, 12, 29)],
    ),
    (
        "0 0 * * 7#1",
        DAY_START,
        [utc(2024, 1, 7), utc(2024, 2, 4), utc(2024, 3, 3), utc(2024, 4, 7)],
    ),
    # a fifth weekday in February exists only in some leap years; it is accepted
    ("0 0 * 2 thu#5", DAY_START, [utc(2024, 2, 29), utc(2052, 2, 29), utc(2080, 2, 29)]),
    ("0 0 * 2 sun#5", DAY_START, [utc(2032, 2, 29), utc(2060, 2, 29), utc(2088, 2, 29)]),
]


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [pytest.param(e, a, x, id=f"{e}-from-{a:%Y-%m-%d}") for e, a, x in HAND_WRITTEN],
)
def test_day_rules_by_hand(expression: str, after: datetime, expected: list[datetime]) -> None:
    assert fires(expression, after, len(expected)) == expected


# --- the seconds field ----------------------------------------------------------------------

SECONDS_START = utc(2024, 3, 9, 23, 58, 30)

SECONDS_CASES: list[tuple[str, Pred]] = [
    ("* * * * * *", lambda d: True),
    ("*/20 * * * * *", lambda d: d.second in {0, 20, 40}),
    ("0 * * * * *", lambda d: d.second == 0),
    ("15,45 */2 * * * *", lambda d: d.second in {15, 45} and d.minute % 2 == 0),
    ("1-30/7 * * * * *", lambda d: d.second in {1, 8, 15, 22, 29}),
    ("50/5 59 * * * *", lambda d: d.second in {50, 55} and d.minute == 59),
    ("0-2 0 0 * * *", lambda d: d.second <= 2 and d.minute == 0 and d.hour == 0),
]


@pytest.mark.parametrize(
    ("expression", "pred"), [pytest.param(e, p, id=e) for e, p in SECONDS_CASES]
)
def test_seconds_field_against_reference(expression: str, pred: Pred) -> None:
    expected = brute(pred, SECONDS_START, 8, SECOND, limit=200_000)
    assert fires(expression, SECONDS_START, 8, seconds=True) == expected


SECONDS_BY_HAND: list[tuple[str, bool, datetime, list[datetime]]] = [
    (
        "30 0 12 * * *",
        True,
        utc(2024, 1, 1, 12, 0, 30),
        [utc(2024, 1, 2, 12, 0, 30), utc(2024, 1, 3, 12, 0, 30)],
    ),
    (
        "0-2 5 * * * *",
        True,
        utc(2024, 1, 1, 10),
        [
            utc(2024, 1, 1, 10, 5, 0),
            utc(2024, 1, 1, 10, 5, 1),
            utc(2024, 1, 1, 10, 5, 2),
            utc(2024, 1, 1, 11, 5, 0),
        ],
    ),
    # Five fields fire at second 0.
    (
        "* * * * *",
        False,
        utc(2024, 1, 1, 10, 0, 0, 1),
        [utc(2024, 1, 1, 10, 1), utc(2024, 1, 1, 10, 2)],
    ),
]


@pytest.mark.parametrize(
    ("expression", "seconds", "after", "expected"),
    [pytest.param(*c, id=f"{c[0]}-from-{c[2]:%H:%M:%S.%f}") for c in SECONDS_BY_HAND],
)
def test_seconds_field_by_hand(
    expression: str, seconds: bool, after: datetime, expected: list[datetime]
) -> None:
    assert fires(expression, after, len(expected), seconds=seconds) == expected


# --- descriptors ----------------------------------------------------------------------------

DESCRIPTOR_START = utc(2024, 5, 6, 12, 30)  # a Monday
YEARLY = [utc(2025, 1, 1), utc(2026, 1, 1), utc(2027, 1, 1)]
DAILY = [utc(2024, 5, 7), utc(2024, 5, 8), utc(2024, 5, 9)]
DESCRIPTORS: list[tuple[str, list[datetime]]] = [
    ("@yearly", YEARLY),
    ("@annually", YEARLY),
    ("@monthly", [utc(2024, 6, 1), utc(2024, 7, 1), utc(2024, 8, 1)]),
    ("@weekly", [utc(2024, 5, 12), utc(2024, 5, 19), utc(2024, 5, 26)]),
    ("@daily", DAILY),
    ("@midnight", DAILY),
    ("@hourly", [utc(2024, 5, 6, 13), utc(2024, 5, 6, 14), utc(2024, 5, 6, 15)]),
]


@pytest.mark.parametrize("seconds", [False, True], ids=["five-field", "seconds"])
@pytest.mark.parametrize(
    ("descriptor", "expected"), [pytest.param(d, x, id=d) for d, x in DESCRIPTORS]
)
@pytest.mark.parametrize("start_second", [0, 30])
def test_descriptors(
    descriptor: str, expected: list[datetime], seconds: bool, start_second: int
) -> None:
    # Under seconds=True a descriptor fires at second 0, never at the start's second.
    after = DESCRIPTOR_START.replace(second=start_second)
    assert fires(descriptor, after, 3, seconds=seconds) == expected


# --- next_after is strictly after -----------------------------------------------------------

STRICT_CASES: list[tuple[str, bool, datetime, datetime]] = [
    ("0 * * * *", False, utc(2024, 1, 1, 10), utc(2024, 1, 1, 11)),
    ("0 * * * *", False, utc(2024, 1, 1, 9, 59, 59, 999_999), utc(2024, 1, 1, 10)),
    ("0 * * * *", False, utc(2024, 1, 1, 10, 0, 0, 1), utc(2024, 1, 1, 11)),
    ("*/15 * * * *", False, utc(2024, 1, 1, 10, 15), utc(2024, 1, 1, 10, 30)),
    ("*/15 * * * *", False, utc(2024, 1, 1, 10, 14, 59, 500_000), utc(2024, 1, 1, 10, 15)),
    ("*/15 * * * *", False, utc(2024, 1, 1, 10, 15, 0, 1), utc(2024, 1, 1, 10, 30)),
    ("* * * * *", False, utc(2024, 1, 1, 10, 0, 30, 123_456), utc(2024, 1, 1, 10, 1)),
    ("* * * * * *", True, utc(2024, 1, 1, 10), utc(2024, 1, 1, 10, 0, 1)),
    ("* * * * * *", True, utc(2024, 1, 1, 10, 0, 0, 500_000), utc(2024, 1, 1, 10, 0, 1)),
    ("* * * * * *", True, utc(2024, 1, 1, 9, 59, 59, 999_999), utc(2024, 1, 1, 10)),
    ("@yearly", False, utc(2024, 1, 1), utc(2025, 1, 1)),
    ("0 0 1 1 *", False, utc(2024, 12, 31, 23, 59, 59, 999_999), utc(2025, 1, 1)),
    ("59 23 31 12 *", False, utc(2024, 12, 31, 23, 59), utc(2025, 12, 31, 23, 59)),
    ("0 0 29 2 *", False, utc(2024, 2, 29), utc(2028, 2, 29)),
]


@pytest.mark.parametrize(
    ("expression", "seconds", "after", "expected"),
    [pytest.param(*c, id=f"{c[0]}-{c[2]:%H:%M:%S.%f}") for c in STRICT_CASES],
)
def test_next_after_is_strictly_after(
    expression: str, seconds: bool, after: datetime, expected: datetime
) -> None:
    found = cron(expression, seconds=seconds).next_after(after)
    assert found is not None
    assert found == expected
    assert found.utcoffset() == timedelta(0)


def test_other_offsets_are_converted_to_utc() -> None:
    # 15:30 at +05:30 is 10:00 UTC, itself a fire time, so the next one is 11:00 UTC.
    after = datetime(2024, 1, 1, 15, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    found = cron("0 * * * *").next_after(after)
    assert found is not None
    assert found == utc(2024, 1, 1, 11)
    assert found.utcoffset() == timedelta(0)


@pytest.mark.parametrize("expression", ["0 * * * *", "@daily", "0 0 L * *"])
def test_naive_datetime_is_rejected(expression: str) -> None:
    trigger = cron(expression)
    with pytest.raises(replicron.NaiveDatetimeError) as info:
        trigger.next_after(datetime(2024, 1, 1, 10))
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, replicron.ReplicronError)


def test_upcoming_count() -> None:
    trigger = cron("*/10 * * * *")
    assert list(upcoming(trigger, utc(2024, 1, 1), 0)) == []
    assert list(upcoming(trigger, utc(2024, 1, 1), 3)) == [
        utc(2024, 1, 1, 0, 10),
        utc(2024, 1, 1, 0, 20),
        utc(2024, 1, 1, 0, 30),
    ]


INSTANTS = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=60, deadline=None)
@given(after=INSTANTS)
def test_next_after_is_the_first_matching_minute(after: datetime) -> None:
    found = cron("*/7 9-17 * * *").next_after(after)
    assert found is not None
    assert found > after
    # Walk every minute from just after `after` up to `found`: none of them may match.
    first = after.replace(second=0, microsecond=0) + MINUTE
    matches = brute(lambda d: d.minute % 7 == 0 and 9 <= d.hour <= 17, first - MINUTE, 1, MINUTE)
    assert found == matches[0]


@settings(max_examples=40, deadline=None)
@given(after=INSTANTS, gap=st.integers(min_value=0, max_value=40 * 86400))
def test_later_start_gives_a_suffix(after: datetime, gap: int) -> None:
    trigger = cron("0 0 */2 * 1")
    later = after + timedelta(seconds=gap)
    early = list(upcoming(trigger, after, 12))
    late = list(upcoming(trigger, later, 3))
    assert all(t > later for t in late)
    tail = [t for t in early if t > later]
    assert len(late) == 3
    assert tail[:3] == late
