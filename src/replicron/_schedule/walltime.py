"""Wall-clock schedules and the walk from local time to UTC instants.

A wall-clock schedule (cron, daily, weekly, monthly) is a set of local dates times a set of
times of day. :func:`next_instant` turns it into UTC instants in one zone, one
constant-offset segment at a time, with the DST rules of Debian's cron:

* *wildcard-class* schedules fire at every real instant whose wall time matches: slots in a
  spring-forward gap are skipped, slots in a repeated hour fire in both passes;
* *fixed-class* schedules fire once per matching wall time: in the first pass of a repeated
  hour, and for slots in a gap of less than three hours at the first instant after the gap
  (several slots there collapse into that one instant). Larger jumps (a zone moving across
  the date line) skip their slots, as Debian's cron does.
"""

from __future__ import annotations

import calendar
import threading
from abc import ABC, abstractmethod
from bisect import bisect_left
from datetime import date

from .tz import MAX_INSTANT, ZoneTimeline

__all__ = [
    "DayRule",
    "FieldTimes",
    "ListTimes",
    "TimeRule",
    "WallSchedule",
    "month_length",
    "next_instant",
]

_DAY = 86400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# Shifts of local time smaller than this are DST-like (gap slots collapse); see module doc.
DST_LIKE_SHIFT = 3 * 3600
# The longest a valid schedule can go without firing is 40 years (a fifth Monday in
# February, across the skipped leap day of 2100); search a little further than that.
_SEARCH_MONTHS = 12 * 60


def month_length(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


class TimeRule(ABC):
    """The seconds of a day at which a schedule fires, in increasing order."""

    first: int

    @abstractmethod
    def next_time(self, second_of_day: int) -> int | None:
        """The first firing second of the day at or after ``second_of_day``."""


class FieldTimes(TimeRule):
    """Times given as allowed hours x minutes x seconds (cron)."""

    __slots__ = ("first", "hours", "minutes", "seconds")

    def __init__(self, hours: tuple[int, ...], minutes: tuple[int, ...], seconds: tuple[int, ...]):
        self.hours, self.minutes, self.seconds = hours, minutes, seconds
        self.first = hours[0] * 3600 + minutes[0] * 60 + seconds[0]

    def next_time(self, second_of_day: int) -> int | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        hour, rest = divmod(second_of_day, 3600)
        minute, second = divmod(rest, 60)
        i = bisect_left(hours, hour)
        if i < len(hours) and hours[i] == hour:
            j = bisect_left(minutes, minute)
            if j < len(minutes) and minutes[j] == minute:
                k = bisect_left(seconds, second)
                if k < len(seconds):
                    return hour * 3600 + minute * 60 + seconds[k]
                j += 1
            if j < len(minutes):
                return hour * 3600 + minutes[j] * 60 + seconds[0]
            i += 1
        if i < len(hours):
            return hours[i] * 3600 + minutes[0] * 60 + seconds[0]
        return None


class ListTimes(TimeRule):
    """Times given as a sorted list of seconds of the day (daily, weekly, monthly)."""

    __slots__ = ("first", "times")

    def __init__(self, times: tuple[int, ...]) -> None:
        self.times = times
        self.first = times[0]

    def next_time(self, second_of_day: int) -> int | None:
        i = bisect_left(self.times, second_of_day)
        return self.times[i] if i < len(self.times) else None


class DayRule(ABC):
    """The days of each month on which a schedule fires; results are cached per month."""

    _CACHE_SIZE = 64

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def days_of_month(self, year: int, month: int) -> tuple[int, ...]:
        key = (year, month)
        days = self._cache.get(key)
        if days is None:
            days = tuple(self.compute_days(year, month))
            with self._lock:
                if len(self._cache) >= self._CACHE_SIZE:
                    self._cache.clear()
                self._cache[key] = days
        return days

    @abstractmethod
    def compute_days(self, year: int, month: int) -> list[int]:
        """The matching days (1-based, increasing) of ``month`` in ``year``."""


class WallSchedule:
    """Matching local date-times: a day rule and a time rule."""

    __slots__ = ("days", "times")

    def __init__(self, days: DayRule, times: TimeRule) -> None:
        self.days, self.times = days, times

    def next_wall(self, lo: int, hi: int) -> int | None:
        """The first matching wall time (local seconds since 1970) in ``[lo, hi)``."""
        day, second_of_day = divmod(lo, _DAY)
        times = self.times
        for _ in range(_SEARCH_MONTHS):
            if day * _DAY >= hi:
                return None
            today = date.fromordinal(day + _EPOCH_ORDINAL)
            year, month, mday = today.year, today.month, today.day
            days = self.days.days_of_month(year, month)
            i = bisect_left(days, mday)
            if i < len(days):
                if days[i] == mday:
                    found = times.next_time(second_of_day)
                    if found is not None:
                        wall = day * _DAY + found
                        return wall if wall < hi else None
                    i += 1
                if i < len(days):
                    wall = (day + days[i] - mday) * _DAY + times.first
                    return wall if wall < hi else None
            if month == 12:
                year, month = year + 1, 1
            else:
                month += 1
            if year > 9998:
                return None
            day = date(year, month, 1).toordinal() - _EPOCH_ORDINAL
            second_of_day = 0
        return None

    def any_between(self, lo: int, hi: int) -> bool:
        return self.next_wall(lo, hi) is not None


def next_instant(
    schedule: WallSchedule, timeline: ZoneTimeline, lo: int, *, wildcard: bool
) -> int | None:
    """The first firing instant (Unix seconds) at or after ``lo``, or ``None``."""
    while lo < MAX_INSTANT:
        start, end, offset, before = timeline.segment(lo)
        wall_lo = lo + offset
        if before > offset and not wildcard:
            # Fall-back: wall times up to start + before were already lived once.
            wall_lo = max(wall_lo, start + before)
        elif (
            before < offset
            and lo <= start
            and not wildcard
            and offset - before < DST_LIKE_SHIFT
            and schedule.any_between(start + before, start + offset)
        ):
            return start
        wall = schedule.next_wall(wall_lo, end + offset)
        if wall is not None:
            return wall - offset
        lo = max(end, lo + 1)
    return None
