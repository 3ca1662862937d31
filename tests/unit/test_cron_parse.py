"""Cron expressions in UTC: every field and value form, and every rejection (docs/cron.md).

Expected fire times never come from replicron: they are written out by hand or found by
``brute``, which walks candidate instants one step at a time and checks each with a plain
Python predicate that states the field's meaning. Day semantics, ``L``, ``#``, seconds,
descriptors and "strictly after" are in ``test_cron_semantics.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

import replicron
from replicron import CronSyntaxError, cron, upcoming
from tests.helpers import brute
from tests.helpers import z as utc

Pred = Callable[[datetime], bool]
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)


def dow(d: datetime) -> int:
    """Cron's weekday number: Sunday = 0, Monday = 1 ... Saturday = 6."""
    return d.isoweekday() % 7


def fires(expression: str, after: datetime, count: int) -> list[datetime]:
    return list(upcoming(cron(expression), after, count))


# --- minute and hour fields: walk every minute ----------------------------------------------

MINUTE_START = utc(2024, 3, 9, 22, 0)  # a Saturday evening: crosses hours, a day, a weekend

MINUTE_CASES: list[tuple[str, Pred]] = [
    ("* * * * *", lambda d: True),
    ("0-59 * * * *", lambda d: True),
    ("5 * * * *", lambda d: d.minute == 5),
    ("0 * * * *", lambda d: d.minute == 0),
    ("59 * * * *", lambda d: d.minute == 59),
    ("0,15,45 * * * *", lambda d: d.minute in {0, 15, 45}),
    ("10-12 * * * *", lambda d: 10 <= d.minute <= 12),
    ("1-1 * * * *", lambda d: d.minute == 1),
    ("1-30/7 * * * *", lambda d: d.minute in {1, 8, 15, 22, 29}),
    ("*/7 * * * *", lambda d: d.minute in {0, 7, 14, 21, 28, 35, 42, 49, 56}),
    ("*/70 * * * *", lambda d: d.minute == 0),
    ("50-59/20 * * * *", lambda d: d.minute == 50),
    ("5/20 * * * *", lambda d: d.minute in {5, 25, 45}),
    ("58/1 * * * *", lambda d: d.minute in {58, 59}),
    ("10-20/5,40 * * * *", lambda d: d.minute in {10, 15, 20, 40}),
    ("*/30,7 * * * *", lambda d: d.minute in {0, 7, 30}),
    ("0 */5 * * *", lambda d: d.minute == 0 and d.hour in {0, 5, 10, 15, 20}),
    ("30 9-17/4 * * *", lambda d: d.minute == 30 and d.hour in {9, 13, 17}),
    ("0 22/1 * * *", lambda d: d.minute == 0 and d.hour in {22, 23}),
    ("15 0,23 * * *", lambda d: d.minute == 15 and d.hour in {0, 23}),
    ("0 */25 * * *", lambda d: d.minute == 0 and d.hour == 0),
    ("0 0-23/6 * * *", lambda d: d.minute == 0 and d.hour in {0, 6, 12, 18}),
    ("*/20 3 * * *", lambda d: d.hour == 3 and d.minute in {0, 20, 40}),
    ("59 23 * * *", lambda d: d.minute == 59 and d.hour == 23),
    ("7 1-2,20-21 * * *", lambda d: d.minute == 7 and d.hour in {1, 2, 20, 21}),
]


@pytest.mark.parametrize(
    ("expression", "pred"), [pytest.param(e, p, id=e) for e, p in MINUTE_CASES]
)
def test_minute_and_hour_fields(expression: str, pred: Pred) -> None:
    expected = brute(pred, MINUTE_START, 12, MINUTE)
    assert fires(expression, MINUTE_START, 12) == expected


# --- day-of-month, month and day-of-week fields: walk every midnight ------------------------

DAY_START = utc(2023, 12, 31)  # a Sunday

DAY_CASES: list[tuple[str, Callable[[datetime], bool]]] = [
    ("0 0 * * *", lambda d: True),
    ("0 0 31 * *", lambda d: d.day == 31),
    ("0 0 2-4 * *", lambda d: 2 <= d.day <= 4),
    ("0 0 */10 * *", lambda d: d.day in {1, 11, 21, 31}),
    ("0 0 */40 * *", lambda d: d.day == 1),
    ("0 0 15/10 * *", lambda d: d.day in {15, 25}),
    ("0 0 1-30/7 * *", lambda d: d.day in {1, 8, 15, 22, 29}),
    ("0 0 1,15,28-29 * *", lambda d: d.day in {1, 15, 28, 29}),
    ("0 0 1 */4 *", lambda d: d.day == 1 and d.month in {1, 5, 9}),
    ("0 0 1 12 *", lambda d: d.day == 1 and d.month == 12),
    ("0 0 1 3/4 *", lambda d: d.day == 1 and d.month in {3, 7, 11}),
    ("0 0 1 jan-mar *", lambda d: d.day == 1 and d.month in {1, 2, 3}),
    ("0 0 1 JAN-mar *", lambda d: d.day == 1 and d.month in {1, 2, 3}),
    ("0 0 1 Jun,DEC *", lambda d: d.day == 1 and d.month in {6, 12}),
    ("0 0 1 feb/3 *", lambda d: d.day == 1 and d.month in {2, 5, 8, 11}),
    ("0 0 1 oct-dec/2 *", lambda d: d.day == 1 and d.month in {10, 12}),
    ("0 0 1 2-mar,sep *", lambda d: d.day == 1 and d.month in {2, 3, 9}),
    ("0 0 * * 0", lambda d: dow(d) == 0),
    ("0 0 * * 7", lambda d: dow(d) == 0),
    ("0 0 * * 0,7", lambda d: dow(d) == 0),
    ("0 0 * * sun", lambda d: dow(d) == 0),
    ("0 0 * * SUN", lambda d: dow(d) == 0),
    ("0 0 * * sUn", lambda d: dow(d) == 0),
    ("0 0 * * 5-7", lambda d: dow(d) in {5, 6, 0}),
    ("0 0 * * 6-7", lambda d: dow(d) in {6, 0}),
    ("0 0 * * */2", lambda d: dow(d) in {0, 2, 4, 6}),
    ("0 0 * * mon-fri", lambda d: dow(d) in {1, 2, 3, 4, 5}),
    ("0 0 * * MON-Fri", lambda d: dow(d) in {1, 2, 3, 4, 5}),
    ("0 0 * * sat,sun", lambda d: dow(d) in {6, 0}),
    ("0 0 * * 1-3,fri", lambda d: dow(d) in {1, 2, 3, 5}),
    ("0 0 * * 0-7", lambda d: True),
    ("0 0 * * sun-sat", lambda d: True),
    ("0 0 * * thu/2", lambda d: dow(d) in {4, 6}),
    ("0 0 * * 1/2", lambda d: dow(d) in {1, 3, 5, 0}),  # 1-7/2: 7 is Sunday
    ("0 0 * * */8", lambda d: dow(d) == 0),
    ("0 0 * * 0-7/7", lambda d: dow(d) == 0),
    ("0 0 * * tue-3", lambda d: dow(d) in {2, 3}),
]


@pytest.mark.parametrize(("expression", "pred"), [pytest.param(e, p, id=e) for e, p in DAY_CASES])
def test_day_month_and_weekday_fields(expression: str, pred: Pred) -> None:
    expected = brute(pred, DAY_START, 15, DAY)
    assert fires(expression, DAY_START, 15) == expected


@pytest.mark.parametrize("expression", ["0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "0 0 * * Sun"])
def test_sunday_spellings_by_hand(expression: str) -> None:
    assert fires(expression, utc(2024, 5, 6), 3) == [
        utc(2024, 5, 12),
        utc(2024, 5, 19),
        utc(2024, 5, 26),
    ]


# --- fire times written out by hand ---------------------------------------------------------

BY_HAND = [
    pytest.param(
        "*/7 * * * *",
        utc(2024, 1, 1, 10, 50),
        # 0,7,...,56 within each hour: the gap from :56 to the next :00 is 4 minutes.
        [
            utc(2024, 1, 1, 10, 56),
            utc(2024, 1, 1, 11, 0),
            utc(2024, 1, 1, 11, 7),
            utc(2024, 1, 1, 11, 14),
        ],
        id="step-restarts-every-hour",
    ),
    pytest.param(
        "1-30/7 * * * *",
        utc(2024, 1, 1, 10, 0),
        [
            utc(2024, 1, 1, 10, 1),
            utc(2024, 1, 1, 10, 8),
            utc(2024, 1, 1, 10, 15),
            utc(2024, 1, 1, 10, 22),
            utc(2024, 1, 1, 10, 29),
            utc(2024, 1, 1, 11, 1),
        ],
        id="range-with-step",
    ),
    pytest.param(
        "*/70 * * * *",
        utc(2024, 1, 1, 10, 0),
        [utc(2024, 1, 1, 11, 0), utc(2024, 1, 1, 12, 0), utc(2024, 1, 1, 13, 0)],
        id="step-larger-than-range-gives-first-value-only",
    ),
    pytest.param(
        "0 0 * * 5-7",
        utc(2024, 5, 6),
        [utc(2024, 5, 10), utc(2024, 5, 11), utc(2024, 5, 12), utc(2024, 5, 17)],
        id="weekday-range-5-7-is-fri-sat-sun",
    ),
    pytest.param(
        "0 0 * * */2",
        utc(2024, 5, 6),
        [utc(2024, 5, 7), utc(2024, 5, 9), utc(2024, 5, 11), utc(2024, 5, 12), utc(2024, 5, 14)],
        id="weekday-every-second-day-is-sun-tue-thu-sat",
    ),
    pytest.param(
        "0 0 31 2 mon",
        utc(2024, 1, 1),
        # Neither day field starts with '*', so the days are ORed: every Monday in February.
        [utc(2024, 2, 5), utc(2024, 2, 12), utc(2024, 2, 19), utc(2024, 2, 26), utc(2025, 2, 3)],
        id="impossible-day-of-month-is-fine-when-day-of-week-can-match",
    ),
]


@pytest.mark.parametrize(("expression", "after", "expected"), BY_HAND)
def test_by_hand(expression: str, after: datetime, expected: list[datetime]) -> None:
    assert fires(expression, after, len(expected)) == expected


# --- rejections -----------------------------------------------------------------------------

MIN, HOUR, DOM, MON, DOW, SEC = "minute", "hour", "day-of-month", "month", "day-of-week", "second"

REJECTED: list[tuple[str, bool, str | None, str]] = [
    # out of range, in every field
    ("60 * * * *", False, MIN, "'60' is out of range 0-59"),
    ("0-60 * * * *", False, MIN, "out of range 0-59"),
    ("* 24 * * *", False, HOUR, "'24' is out of range 0-23"),
    ("* * 0 * *", False, DOM, "'0' is out of range 1-31"),
    ("* * 32 * *", False, DOM, "'32' is out of range 1-31"),
    ("* * * 13 *", False, MON, "'13' is out of range 1-12"),
    ("* * * 0 *", False, MON, "'0' is out of range 1-12"),
    ("* * * * 8", False, DOW, "'8' is out of range 0-7"),
    ("60 * * * * *", True, SEC, "'60' is out of range 0-59"),
    ("-1 * * * *", False, MIN, "missing value"),
    # malformed steps and ranges
    ("*/5/2 * * * *", False, MIN, "more than one '/'"),
    ("0 1-10/2/3 * * *", False, HOUR, "more than one '/'"),
    ("5-1 * * * *", False, MIN, "reversed"),
    ("0 0 * dec-jan *", False, MON, "reversed"),
    ("0 0 * * fri-mon", False, DOW, "reversed"),
    ("0 0 * * mon-sun", False, DOW, "reversed"),  # sun is 0
    ("*/0 * * * *", False, MIN, "step in '*/0' must be at least 1"),
    ("0 0 1-31/0 * *", False, DOM, "must be at least 1"),
    ("*/a * * * *", False, MIN, "step 'a' in '*/a' is not a number"),
    ("*/ * * * *", False, MIN, "is not a number"),
    ("0 */-1 * * *", False, HOUR, "is not a number"),
    ("1,,2 * * * *", False, MIN, "empty list element"),
    ("1, * * * *", False, MIN, "empty list element"),
    ("0 0 * * ,mon", False, DOW, "empty list element"),
    # names: exactly three letters, and only in the month and weekday fields
    ("0 0 * * mond", False, DOW, "'mond' is not a number or a three-letter name"),
    ("0 0 * * monday", False, DOW, "three-letter name"),
    ("0 0 * janu *", False, MON, "'janu' is not a number or a three-letter name"),
    ("0 0 * * jan", False, DOW, "'jan' is not a number or a three-letter name"),
    ("0 0 * mon *", False, MON, "'mon' is not a number or a three-letter name"),
    ("mon * * * *", False, MIN, "'mon' is not a number"),
    ("0 jan * * *", False, HOUR, "'jan' is not a number"),
    ("0 0 mon * *", False, DOM, "'mon' is not a number"),
    ("x * * * * *", True, SEC, "'x' is not a number"),
    # wrong number of fields
    ("* * * *", False, None, "expected 5 fields, got 4"),
    ("* * * * * *", False, None, "seconds=True"),
    ("0 * * * * * *", False, None, "expected 5 fields, got 7"),
    ("* * * * *", True, None, "expected 6 fields, got 5"),
    ("0 0 * * * * *", True, None, "expected 6 fields, got 7"),
    # day/month combinations that can never fire
    ("0 0 31 2 *", False, DOM, "can never fire"),
    ("0 0 30 2 *", False, DOM, "can never fire"),
    ("0 0 30,31 feb *", False, DOM, "can never fire"),
    ("0 0 31 4,6,9,11 *", False, DOM, "can never fire"),
    ("0 0 31 2 */2", False, DOM, "can never fire"),  # '*' in day-of-week: AND
    # '#' and 'L' misplaced, Quartz syntax
    ("0 0 * * #3", False, DOW, "needs a weekday"),
    ("0 0 * * mon#6", False, DOW, "must be 1-5"),
    ("0 0 * * 1#0", False, DOW, "must be 1-5"),
    ("0 0 * * mon#", False, DOW, "must be 1-5"),
    ("0 0 * * 1-5#2", False, DOW, "single weekday"),
    ("0 0 1#2 * *", False, DOM, "only allowed in the day-of-week field"),
    ("1#1 * * * *", False, MIN, "only allowed in the day-of-week field"),
    ("0 0 * 1#1 *", False, MON, "only allowed in the day-of-week field"),
    ("L * * * *", False, MIN, "'L'"),
    ("0 L * * *", False, HOUR, "'L'"),
    ("0 0 * L *", False, MON, "'L'"),
    ("0 0 * * L", False, DOW, "'L'"),
    ("0 0 * * 5L", False, DOW, "'L'"),
    ("0 0 5L * *", False, DOM, "'L'"),
    ("0 0 L-5 * *", False, DOM, "'L'"),
    ("0 0 LW * *", False, DOM, "'L'"),
    ("0 0 W * *", False, DOM, "'W'"),
    ("0 0 15W * *", False, DOM, "'W'"),
    ("0 0 ? * *", False, DOM, "Quartz"),
    ("0 0 * * ?", False, DOW, "Quartz"),
    # whole-expression problems
    ("@reboot", False, None, "@reboot is not supported"),
    ("@every 5m", False, None, "@every is not supported"),
    ("@fortnightly", False, None, "unknown descriptor '@fortnightly'"),
    ("@", False, None, "unknown descriptor"),
    ("@daily 0", False, None, "unexpected text after @daily"),
    ("CRON_TZ=UTC 0 * * * *", False, None, "CRON_TZ= and TZ= are not supported"),
    ("", False, None, "the expression is empty"),
    ("   ", False, None, "the expression is empty"),
]


@pytest.mark.parametrize(
    ("expression", "seconds", "field", "fragment"),
    [pytest.param(*case, id=f"{case[0]!r}{'-seconds' if case[1] else ''}") for case in REJECTED],
)
def test_rejected(expression: str, seconds: bool, field: str | None, fragment: str) -> None:
    with pytest.raises(CronSyntaxError) as info:
        cron(expression, seconds=seconds)
    error = info.value
    assert error.field == field
    message = str(error)
    assert fragment in message
    if field is not None:
        assert f"in the {field} field of cron expression {expression!r}" in message
    else:
        assert message.endswith(f"(cron expression {expression!r})")


def test_full_message_names_value_range_field_and_expression() -> None:
    with pytest.raises(CronSyntaxError) as info:
        cron("60 * * * *")
    assert str(info.value) == (
        "'60' is out of range 0-59 in the minute field of cron expression '60 * * * *'"
    )


def test_six_fields_without_seconds_points_to_the_option() -> None:
    with pytest.raises(CronSyntaxError, match=r"seconds=True") as info:
        cron("0 0 12 * * *")
    assert info.value.field is None


def test_february_29_is_accepted_and_fires_only_in_leap_years() -> None:
    trigger = cron("0 0 29 2 *")
    assert list(upcoming(trigger, utc(2023, 1, 1), 3)) == [
        utc(2024, 2, 29),
        utc(2028, 2, 29),
        utc(2032, 2, 29),
    ]
    # 2100 is not a leap year: eight years pass between two runs.
    assert list(upcoming(trigger, utc(2097, 1, 1), 1)) == [utc(2104, 2, 29)]


@pytest.mark.parametrize("value", [None, 5, b"* * * * *", ["*"] * 5])
def test_non_str_expression_is_a_type_error(value: object) -> None:
    with pytest.raises(TypeError):
        cron(value)  # type: ignore[arg-type]


def test_cron_syntax_error_hierarchy() -> None:
    assert issubclass(CronSyntaxError, replicron.ReplicronError)
    assert issubclass(CronSyntaxError, ValueError)
    with pytest.raises(ValueError):
        cron("61 * * * *")
    with pytest.raises(replicron.ReplicronError):
        cron("61 * * * *")
