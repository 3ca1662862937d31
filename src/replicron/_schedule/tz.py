"""Time zones: resolving names, and each zone's timeline of UTC-offset periods.

The timeline is what lets the wall-clock triggers work in local seconds: between two
transitions a zone's offset is constant, so local time is UTC plus one number. Transitions
are found by probing the zone (one offset a day, then bisection to the second), once per
zone and year, and shared by every trigger in the process.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import cache
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from replicron.errors import InvalidTimezoneError

__all__ = [
    "EPOCH",
    "MAX_INSTANT",
    "MICROSECOND",
    "MIN_INSTANT",
    "UTC",
    "Segment",
    "ZoneTimeline",
    "from_micros",
    "from_unix",
    "resolve_zone",
    "timeline_for",
    "to_micros",
    "to_unix",
    "zone_name",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DAY = 86400
# Instants replicron computes with: years 2 to 9998, so that local times a day either side
# stay inside what datetime can represent.
MIN_INSTANT = int((datetime(2, 1, 1, tzinfo=UTC) - EPOCH).total_seconds())
MAX_INSTANT = int((datetime(9999, 1, 1, tzinfo=UTC) - EPOCH).total_seconds())
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu"})


def resolve_zone(value: str | tzinfo | None) -> tzinfo | None:
    """Turn an IANA name or a tzinfo into a tzinfo; ``None`` stays ``None``.

    Raises :class:`InvalidTimezoneError` for unknown names and unusable objects.
    """
    if value is None:
        return None
    if isinstance(value, tzinfo):
        try:
            value.utcoffset(datetime(2000, 1, 1))
        except Exception as exc:
            raise InvalidTimezoneError(
                f"time zone {value!r} cannot give a UTC offset: {exc}"
            ) from exc
        return value
    if not isinstance(value, str):
        raise InvalidTimezoneError(
            f"time zone must be an IANA name such as 'Europe/Kyiv' or a tzinfo, "
            f"not {type(value).__name__}"
        )
    if value in _UTC_NAMES:
        return UTC
    if not value or value != value.strip():
        raise InvalidTimezoneError(f"unknown time zone {value!r}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidTimezoneError(
            f"unknown time zone {value!r} (expected an IANA name such as 'Europe/Kyiv')"
        ) from exc


def zone_name(zone: tzinfo | None) -> str:
    """A readable name: the IANA key where there is one."""
    if zone is None or zone is UTC:
        return "UTC"
    return zone.key if isinstance(zone, ZoneInfo) and zone.key else str(zone)


def to_unix(instant: datetime) -> int:
    """Whole seconds since the Unix epoch, rounded down; ``instant`` must be aware."""
    delta = instant - EPOCH
    return delta.days * _DAY + delta.seconds


def from_unix(seconds: int) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


MICROSECOND = timedelta(microseconds=1)


def to_micros(instant: datetime) -> int:
    """Whole microseconds since the Unix epoch (exact: a datetime holds no finer); ``instant``
    must be aware."""
    return (instant - EPOCH) // MICROSECOND


def from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


class Segment(NamedTuple):
    """A period ``[start, end)`` of UTC instants during which the zone's offset is constant.

    ``offset_before`` is the offset in force just before ``start``: where it differs from
    ``offset`` the period begins with a transition (a gap when it was smaller, a repeated
    stretch of wall-clock time when it was larger).
    """

    start: int
    end: int
    offset: int
    offset_before: int


class _Year(NamedTuple):
    starts: list[int]  # first element is the year's first instant, the rest are transitions
    offsets: list[int]
    offset_before: int  # offset at the last instant of the previous year
    end: int  # first instant of the next year


class ZoneTimeline:
    """Transitions of one time zone, computed lazily a year at a time and cached."""

    def __init__(self, zone: tzinfo) -> None:
        self.zone = zone
        self._fixed = _fixed_offset(zone)
        self._years: dict[int, _Year] = {}
        self._lock = threading.Lock()
        self._last: Segment | None = None

    def offset_at(self, instant: int) -> int:
        if self._fixed is not None:
            return self._fixed
        off = datetime.fromtimestamp(instant, self.zone).utcoffset()
        assert off is not None
        return off.days * _DAY + off.seconds

    def segment(self, instant: int) -> Segment:
        """The constant-offset period containing ``instant``."""
        if self._fixed is not None:
            return Segment(MIN_INSTANT, MAX_INSTANT, self._fixed, self._fixed)
        last = self._last
        if last is not None and last.start <= instant < last.end:
            return last
        seg = self._compute_segment(instant)
        self._last = seg
        return seg

    def _compute_segment(self, instant: int) -> Segment:
        year_no = from_unix(instant).year
        year = self._year(year_no)
        k = bisect_right(year.starts, instant) - 1
        start, offset = year.starts[k], year.offsets[k]
        before = year.offsets[k - 1] if k > 0 else year.offset_before
        if k == 0 and before == offset and year_no > 2:
            # No transition at new year: the period began in the previous year.
            prev = self._year(year_no - 1)
            start = prev.starts[-1]
            before = prev.offsets[-2] if len(prev.starts) > 1 else prev.offset_before
        if k + 1 < len(year.starts):
            end = year.starts[k + 1]
        else:
            end = year.end
            if year_no < 9998:
                nxt = self._year(year_no + 1)
                if nxt.offset_before == nxt.offsets[0]:
                    end = nxt.starts[1] if len(nxt.starts) > 1 else nxt.end
        return Segment(start, end, offset, before)

    def _year(self, year_no: int) -> _Year:
        year = self._years.get(year_no)
        if year is None:
            year = self._probe_year(year_no)
            with self._lock:
                self._years[year_no] = year
        return year

    def _probe_year(self, year_no: int) -> _Year:
        first = to_unix(datetime(year_no, 1, 1, tzinfo=UTC))
        end = to_unix(datetime(year_no + 1, 1, 1, tzinfo=UTC))
        starts, offsets = [first], [self.offset_at(first)]
        lo, lo_off = first, offsets[0]
        for hi in [*range(first + _DAY, end, _DAY), end]:
            hi_off = self.offset_at(hi)
            # Several transitions between two samples are found one by one.
            while lo_off != hi_off:
                lo = self._first_change(lo, hi, lo_off)
                lo_off = self.offset_at(lo)
                if lo < end:
                    starts.append(lo)
                    offsets.append(lo_off)
            lo, lo_off = hi, hi_off
        return _Year(starts, offsets, self.offset_at(first - 1), end)

    def _first_change(self, lo: int, hi: int, lo_off: int) -> int:
        """The first instant in ``(lo, hi]`` whose offset differs from ``lo_off``."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.offset_at(mid) == lo_off:
                lo = mid
            else:
                hi = mid
        return hi


def _fixed_offset(zone: tzinfo) -> int | None:
    if isinstance(zone, timezone):
        off = zone.utcoffset(None)
        return off.days * _DAY + off.seconds
    return None


@cache
def timeline_for(zone: tzinfo) -> ZoneTimeline:
    """The shared timeline of ``zone`` (one per zone object for the whole process)."""
    return ZoneTimeline(zone)
