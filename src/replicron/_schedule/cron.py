"""The cron parser: Debian cron's meaning, stricter syntax, and a few documented extensions.

See ``docs/cron.md`` for the rules with examples. Parsing produces a :class:`ParsedCron`,
whose day rule and time rule plug into :mod:`replicron._schedule.walltime`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from functools import lru_cache

from replicron.errors import ArgumentTypeError, CronSyntaxError

from .walltime import DayRule, FieldTimes, WallSchedule, month_length

__all__ = ["CronDays", "ParsedCron", "parse_cron"]

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0


_SECOND = _FieldSpec("second", 0, 59)
_MINUTE = _FieldSpec("minute", 0, 59)
_HOUR = _FieldSpec("hour", 0, 23)
_DOM = _FieldSpec("day-of-month", 1, 31)
_MONTH = _FieldSpec("month", 1, 12, _MONTH_NAMES, 1)
_DOW = _FieldSpec("day-of-week", 0, 7, _DAY_NAMES, 0)

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_REJECTED_DESCRIPTORS = {
    "@reboot": "@reboot is not supported: a replicated job has no single start; "
    "use run_now or a one-time trigger",
    "@every": "@every is not supported: use every(...) for intervals",
}
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class ParsedCron:
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: CronDays
    wildcard: bool  # minute or hour field starts with '*': DST wildcard class
    schedule: WallSchedule  # shared by every trigger with the same expression


class CronDays(DayRule):
    """Debian's day rule: day-of-month and day-of-week are ANDed if either field's text
    starts with ``*``, otherwise ORed; plus ``L`` and ``#`` as extensions."""

    def __init__(
        self,
        months: frozenset[int],
        month_days: frozenset[int],
        last_day: bool,
        weekdays: frozenset[int],
        nth_weekdays: frozenset[tuple[int, int]],
        both_must_match: bool,
    ) -> None:
        super().__init__()
        self.months = months
        self.month_days = month_days
        self.last_day = last_day
        self.weekdays = weekdays  # 0 = Sunday
        self.nth_weekdays = nth_weekdays  # (weekday, n): the nth such weekday of the month
        self.both_must_match = both_must_match

    def compute_days(self, year: int, month: int) -> list[int]:
        if month not in self.months:
            return []
        first_weekday = (date(year, month, 1).weekday() + 1) % 7
        return self._matching(month_length(year, month), first_weekday)

    def _matching(self, length: int, first_weekday: int) -> list[int]:
        found = []
        for day in range(1, length + 1):
            dom = day in self.month_days or (self.last_day and day == length)
            weekday = (first_weekday + day - 1) % 7
            dow = weekday in self.weekdays or (weekday, (day + 6) // 7) in self.nth_weekdays
            if (dom and dow) if self.both_must_match else (dom or dow):
                found.append(day)
        return found

    def can_fire(self) -> bool:
        """Whether some real month matches (every month length x first weekday occurs)."""
        for month in sorted(self.months):
            lengths = (28, 29) if month == 2 else (month_length(2001, month),)
            for length in lengths:
                if any(self._matching(length, first) for first in range(7)):
                    return True
        return False


def parse_cron(expression: str, *, seconds: bool = False) -> ParsedCron:
    """Parse ``expression``; raises :class:`CronSyntaxError` naming the field at fault."""
    if not isinstance(expression, str):
        raise ArgumentTypeError(f"cron expression must be a str, not {type(expression).__name__}")
    return _parse_cached(expression, seconds)


@lru_cache(maxsize=4096)
def _parse_cached(expression: str, with_seconds: bool) -> ParsedCron:
    text = expression.strip()
    if not text:
        raise CronSyntaxError(expression, "the expression is empty")
    if text.upper().startswith(("CRON_TZ=", "TZ=")):
        raise CronSyntaxError(
            expression, "CRON_TZ= and TZ= are not supported: pass tz=... to choose the time zone"
        )
    if text.startswith("@"):
        fields = _expand_descriptor(expression, text)
        if with_seconds:
            fields = ["0", *fields]
    else:
        fields = text.split()
        wanted = 6 if with_seconds else 5
        if len(fields) != wanted:
            hint = ""
            if len(fields) == 6 and not with_seconds:
                hint = " (pass seconds=True for a leading seconds field)"
            elif len(fields) == 5 and with_seconds:
                hint = " (seconds=True expects a leading seconds field)"
            raise CronSyntaxError(expression, f"expected {wanted} fields, got {len(fields)}{hint}")
    second_text = fields[0] if with_seconds else "0"
    minute_text, hour_text, dom_text, month_text, dow_text = fields[-5:]

    sec = _parse_values(expression, second_text, _SECOND)
    minute = _parse_values(expression, minute_text, _MINUTE)
    hour = _parse_values(expression, hour_text, _HOUR)
    month_days, last_day = _parse_month_days(expression, dom_text)
    months = _parse_values(expression, month_text, _MONTH)
    weekdays, nth = _parse_weekdays(expression, dow_text)
    days = CronDays(
        frozenset(months),
        frozenset(month_days),
        last_day,
        frozenset(weekdays),
        frozenset(nth),
        both_must_match=dom_text.startswith("*") or dow_text.startswith("*"),
    )
    if not days.can_fire():
        raise CronSyntaxError(
            expression,
            "can never fire: no month in the month field has a day that matches",
            _DOM.name,
        )
    seconds_, minutes_, hours_ = (tuple(sorted(values)) for values in (sec, minute, hour))
    return ParsedCron(
        seconds_,
        minutes_,
        hours_,
        days,
        wildcard=minute_text.startswith("*") or hour_text.startswith("*"),
        schedule=WallSchedule(days, FieldTimes(hours_, minutes_, seconds_)),
    )


def _expand_descriptor(expression: str, text: str) -> list[str]:
    word = text.split()[0].lower()
    if word in _REJECTED_DESCRIPTORS:
        raise CronSyntaxError(expression, _REJECTED_DESCRIPTORS[word])
    if word not in _DESCRIPTORS:
        known = " ".join(_DESCRIPTORS)
        raise CronSyntaxError(expression, f"unknown descriptor {word!r} (known: {known})")
    if text.lower() != word:
        raise CronSyntaxError(expression, f"unexpected text after {word}")
    return _DESCRIPTORS[word].split()


def _parse_values(expression: str, text: str, spec: _FieldSpec) -> set[int]:
    values: set[int] = set()
    for item in _items(expression, text, spec):
        values.update(_parse_item(expression, item, spec))
    return values


def _items(expression: str, text: str, spec: _FieldSpec) -> list[str]:
    items = text.split(",")
    if any(not item for item in items):
        raise CronSyntaxError(expression, f"empty list element in {text!r}", spec.name)
    return items


def _unknown_value_reason(text: str, spec: _FieldSpec) -> str:
    upper = text.upper()
    if "?" in text:
        return f"'?' in {text!r} is Quartz syntax, not supported: use '*'"
    if "#" in text:
        return f"'#' in {text!r} is only allowed in the day-of-week field, as in 'mon#1'"
    if "L" in upper:
        return f"'L' in {text!r} must stand alone: it means the last day of the month"
    if "W" in upper:
        return f"'W' (nearest weekday) in {text!r} is not supported"
    what = "a number or a three-letter name" if spec.names else "a number"
    if not text:
        return f"missing value, expected {what}"
    return f"{text!r} is not {what}"


def _parse_item(expression: str, item: str, spec: _FieldSpec) -> range:
    range_text, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if "/" in step_text:
            raise CronSyntaxError(expression, f"more than one '/' in {item!r}", spec.name)
        if not _NUMBER.fullmatch(step_text):
            raise CronSyntaxError(
                expression, f"step {step_text!r} in {item!r} is not a number", spec.name
            )
        step = int(step_text)
        if step == 0:
            raise CronSyntaxError(expression, f"step in {item!r} must be at least 1", spec.name)
    if range_text == "*":
        low, high = spec.low, spec.high
    else:
        low_text, dash, high_text = range_text.partition("-")
        low = _parse_value(expression, low_text, spec)
        if dash:
            high = _parse_value(expression, high_text, spec)
            if high < low:
                hint = ""
                if spec is _DOW and high == 0:
                    hint = f" (Sunday is 0 here: write '{low_text}-7' to end on Sunday)"
                raise CronSyntaxError(
                    expression,
                    f"range {range_text!r} is reversed and would never fire{hint}",
                    spec.name,
                )
        else:
            # 'N/step' is 'N-max/step'; a bare 'N' is the single value.
            high = spec.high if slash else low
    return range(low, high + 1, step)


def _parse_value(expression: str, text: str, spec: _FieldSpec) -> int:
    if _NUMBER.fullmatch(text):
        value = int(text)
    elif spec.names and text.lower() in spec.names:
        value = spec.names.index(text.lower()) + spec.name_base
    else:
        raise CronSyntaxError(expression, _unknown_value_reason(text, spec), spec.name)
    if not spec.low <= value <= spec.high:
        raise CronSyntaxError(
            expression, f"{text!r} is out of range {spec.low}-{spec.high}", spec.name
        )
    return value


def _parse_month_days(expression: str, text: str) -> tuple[set[int], bool]:
    days: set[int] = set()
    last = False
    for item in _items(expression, text, _DOM):
        if item.upper() == "L":
            last = True
        else:
            days.update(_parse_item(expression, item, _DOM))
    return days, last


def _parse_weekdays(expression: str, text: str) -> tuple[set[int], set[tuple[int, int]]]:
    weekdays: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in _items(expression, text, _DOW):
        base, hash_mark, n_text = item.partition("#")
        if hash_mark:
            if not base:
                raise CronSyntaxError(expression, f"'#' in {item!r} needs a weekday", _DOW.name)
            if any(c in base for c in "-/*,"):
                raise CronSyntaxError(
                    expression, f"'#' in {item!r} needs a single weekday", _DOW.name
                )
            weekday = _parse_value(expression, base, _DOW) % 7
            if not _NUMBER.fullmatch(n_text) or not 1 <= int(n_text) <= 5:
                raise CronSyntaxError(
                    expression, f"{n_text!r} in {item!r} must be 1-5 (nth weekday)", _DOW.name
                )
            nth.add((weekday, int(n_text)))
        else:
            weekdays.update(v % 7 for v in _parse_item(expression, item, _DOW))
    return weekdays, nth
