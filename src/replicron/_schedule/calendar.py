"""Day rules and times of day for the daily, weekly and monthly triggers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import date, time

from replicron.errors import InvalidDayError, InvalidIntervalError, InvalidTimeOfDayError

from .walltime import DayRule, month_length

__all__ = [
    "DailyDays",
    "MonthlyDays",
    "WeeklyDays",
    "parse_month_days",
    "parse_positive",
    "parse_times_of_day",
    "parse_weekdays",
]

_TIME_TEXT = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?")
_WEEKDAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

TimeOfDay = str | time


def parse_positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidIntervalError(f"{what} must be a whole number, not {value!r}")
    if value < 1:
        raise InvalidIntervalError(f"{what} must be at least 1, got {value}")
    return value


def parse_times_of_day(at: TimeOfDay | Iterable[TimeOfDay]) -> tuple[int, ...]:
    """Seconds of the day, sorted and unique, from ``"HH:MM"``, ``"HH:MM:SS"`` or ``time``."""
    items: list[object] = [at] if isinstance(at, str | time) or not _is_iterable(at) else list(at)
    if not items:
        raise InvalidTimeOfDayError("at= needs at least one time of day")
    return tuple(sorted({_time_of_day(item) for item in items}))


def _time_of_day(value: object) -> int:
    if isinstance(value, time):
        if value.tzinfo is not None:
            raise InvalidTimeOfDayError(
                f"time of day {value} carries a time zone: pass a plain time and tz=... instead"
            )
        if value.microsecond:
            raise InvalidTimeOfDayError(f"time of day {value} has fractions of a second")
        return value.hour * 3600 + value.minute * 60 + value.second
    if not isinstance(value, str):
        raise InvalidTimeOfDayError(
            f"time of day must be 'HH:MM', 'HH:MM:SS' or a datetime.time, not {value!r}"
        )
    match = _TIME_TEXT.fullmatch(value.strip())
    if match is None:
        raise InvalidTimeOfDayError(f"time of day {value!r} is not 'HH:MM' or 'HH:MM:SS'")
    hour, minute, second = (int(part or 0) for part in match.groups())
    if hour > 23:
        raise InvalidTimeOfDayError(f"hour {hour} in {value!r} is out of range 0-23")
    if minute > 59:
        raise InvalidTimeOfDayError(f"minute {minute} in {value!r} is out of range 0-59")
    if second > 59:
        raise InvalidTimeOfDayError(f"second {second} in {value!r} is out of range 0-59")
    return hour * 3600 + minute * 60 + second


def parse_weekdays(days: object) -> frozenset[int]:
    """Weekdays as Python numbers them (Monday = 0), from names or numbers."""
    items = [days] if isinstance(days, str | int) else list(_iterable(days, "days"))
    if not items:
        raise InvalidDayError("days= needs at least one weekday")
    return frozenset(_weekday(item) for item in items)


def _weekday(value: object) -> int:
    if isinstance(value, str):
        text = value.strip().lower()
        for number, name in enumerate(_WEEKDAY_NAMES):
            if text in (name, name[:3]):
                return number
        raise InvalidDayError(f"unknown weekday {value!r} (use 'mon'..'sun' or 'monday'..)")
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= 6:
            return int(value)
        raise InvalidDayError(f"weekday {value} is out of range 0-6 (Monday = 0, Sunday = 6)")
    raise InvalidDayError(f"weekday must be a name or a number 0-6, not {value!r}")


def parse_month_days(days: object) -> frozenset[int]:
    """Days of the month: 1..31, or -1..-31 counted from the month's end (-1 = last day)."""
    items = [days] if isinstance(days, int) else list(_iterable(days, "days"))
    if not items:
        raise InvalidDayError("days= needs at least one day of the month")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidDayError(f"day of month must be a whole number, not {item!r}")
        if item == 0 or not -31 <= item <= 31:
            raise InvalidDayError(
                f"day of month {item} is out of range 1..31 (or -1..-31 from the month's end)"
            )
    return frozenset(item for item in items if isinstance(item, int))


def _is_iterable(value: object) -> bool:
    return isinstance(value, Iterable)


def _iterable(value: object, what: str) -> Iterable[object]:
    if isinstance(value, Iterable):
        return value
    raise InvalidDayError(f"{what}= must be a day or a list of days, not {value!r}")


class DailyDays(DayRule):
    """Every ``n``-th day, counted from ``anchor`` (default 1970-01-01)."""

    def __init__(self, every_n_days: int, anchor: date) -> None:
        super().__init__()
        self.every_n_days = every_n_days
        self.anchor = anchor.toordinal()

    def compute_days(self, year: int, month: int) -> list[int]:
        first = date(year, month, 1).toordinal()
        skip = (self.anchor - first) % self.every_n_days
        return list(range(1 + skip, month_length(year, month) + 1, self.every_n_days))


class WeeklyDays(DayRule):
    """Weekdays as Python numbers them (Monday = 0)."""

    def __init__(self, days: frozenset[int]) -> None:
        super().__init__()
        self.weekdays = days

    def compute_days(self, year: int, month: int) -> list[int]:
        first_weekday = date(year, month, 1).weekday()
        return [
            day
            for day in range(1, month_length(year, month) + 1)
            if (first_weekday + day - 1) % 7 in self.weekdays
        ]


class MonthlyDays(DayRule):
    """Listed days; a day the month does not have (31 in April, -30 in February) is skipped."""

    def __init__(self, days: frozenset[int]) -> None:
        super().__init__()
        self.days = days

    def compute_days(self, year: int, month: int) -> list[int]:
        length = month_length(year, month)
        found = {day if day > 0 else length + 1 + day for day in self.days}
        return sorted(day for day in found if 1 <= day <= length)
