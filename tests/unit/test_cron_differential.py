"""Differential test: replicron's cron against cronsim, an independent implementation.

cronsim (a test-only oracle) follows Debian cron closely, including Debian's special handling
of fixed-time jobs across DST transitions, so on random valid expressions, zones and start
instants the two must produce the same fire times, compared as UTC instants.

Where cronsim is known to differ from Debian cron (docs/cron.md), the input is excluded.
Every exclusion is listed in :func:`cronsim_deviation` with the reason; the strategies below
avoid generating those inputs in the first place, so few examples are thrown away:

* zones whose DST shift is 30 or 45 minutes (Australia/Lord_Howe, Pacific/Chatham): cronsim
  moves by whole hours there. They are simply not in the zone lists;
* zones whose spring-forward gap takes away local midnight ("missing midnights":
  America/Sao_Paulo, America/Havana, Asia/Beirut, America/Santiago, Atlantic/Azores, ...):
  cronsim starts each new day at a naive 00:00 that does not exist and lands in the wrong
  hour. Not in the zone lists either; :func:`test_zone_lists_fit_the_exclusions` checks the
  tz database agrees. (A *repeated* midnight is fine: Asia/Jerusalem 2000-2004 is tested.)
* equal-bound stepped ranges (``5-5/4``): cronsim reads a range with one value as ``5/4``
  (5, 9, 13, ...), Debian as the single value 5. Never generated;
* fixed-class 5-field jobs starting in the second pass of a repeated hour: cronsim walks
  fixed-class jobs in naive wall time, so it returns the first-pass instant of a later
  wall time, which lies *before* the start. Rejected;
* 6-field (seconds) expressions of the fixed class in zones with DST: cronsim applies Debian's
  fixed-time DST handling to 5-field expressions only, replicron to both. These are compared
  only in UTC, fixed-offset and DST-free zones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import cache
from itertools import zip_longest
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from replicron import cron, upcoming
from replicron.errors import CronSyntaxError

# Fire times compared per example, and how far ahead at most (cronsim gives up after 50
# years without a fire; replicron searches 60).
FIRES = 20
HORIZON_YEARS = 30
FIRST_YEAR, LAST_YEAR = 2000, 2040

# Zones with DST whose transitions shift by whole hours, away from midnight (2000-2070).
DST_ZONES = (
    "Europe/Kyiv",
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "America/Los_Angeles",
    "Europe/Dublin",  # negative DST in the tz source; same offsets as London
    "America/Chicago",
    "Pacific/Auckland",
    "Europe/Berlin",
    "America/Halifax",
    "Australia/Adelaide",  # half-hour offset (+09:30/+10:30), whole-hour shift
    "Europe/Lisbon",
    "America/Mexico_City",  # DST abolished in 2022
    "Europe/Moscow",  # permanent +04 in 2011, back to +03 in 2014
    "America/Anchorage",
    "Asia/Jerusalem",  # repeated midnight: fall-back 01:00 -> 00:00 in 2000-2004 (no deviation)
)
# UTC, fixed offsets, and zones without transitions since 2000.
FIXED_ZONES = (
    "UTC",
    "+05:45",
    "-03:30",
    "Etc/GMT+5",
    "Asia/Tokyo",
    "Asia/Kolkata",
    "America/Phoenix",
    "Pacific/Honolulu",
)
# cronsim's documented deviations: listed here so that they are never used by accident.
EXCLUDED_ZONES = (
    "Australia/Lord_Howe",  # 30-minute DST shift
    "Pacific/Chatham",  # 45-minute offset, DST at 02:45
    "America/Sao_Paulo",  # missing midnights (DST began at 00:00 until 2019)
    "America/Havana",  # missing midnights
    "Asia/Beirut",  # missing midnights
    "America/Santiago",  # missing midnights
    "Atlantic/Azores",  # DST begins at local midnight
)

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def zone_for(label: str) -> tzinfo:
    if label == "UTC":
        return UTC
    if label[0] in "+-":
        sign = -1 if label[0] == "-" else 1
        hours, minutes = int(label[1:3]), int(label[4:6])
        return timezone(sign * timedelta(hours=hours, minutes=minutes))
    return ZoneInfo(label)


@dataclass(frozen=True)
class Case:
    expression: str
    seconds: bool
    zone: str
    start: datetime  # aware, UTC

    def fields(self) -> list[str]:
        """The expression as cronsim gets it: 5 or 6 fields, descriptors expanded."""
        text = self.expression
        fields = _DESCRIPTORS[text.lower()].split() if text.startswith("@") else text.split()
        if self.seconds and text.startswith("@"):
            fields = ["0", *fields]
        return fields

    def is_wildcard_class(self) -> bool:
        minute, hour = self.fields()[-5:-3]
        return minute.startswith("*") or hour.startswith("*")


_EQUAL_BOUND_STEP = re.compile(r"(?:^|,)(\w+)-(\w+)/")


def cronsim_deviation(case: Case) -> str | None:
    """Why cronsim cannot be the oracle for ``case``, or ``None`` if it can."""
    if case.zone not in DST_ZONES + FIXED_ZONES:
        return f"zone {case.zone} is not one of the checked zones"
    for text in case.fields():
        for low, high in _EQUAL_BOUND_STEP.findall(text):
            if low.lower() == high.lower():
                # cronsim: '5-5/4' = 5,9,13,...; Debian and replicron: 5.
                return f"equal-bound stepped range in {text!r}"
    fixed_class = not case.is_wildcard_class()
    if fixed_class and case.seconds and case.zone in DST_ZONES:
        # cronsim's fixed-time DST handling (Debian's) is for 5-field expressions only; with
        # seconds it fires in both passes and skips gaps. replicron treats both alike.
        return "6-field fixed-class expression in a zone with DST"
    if fixed_class and not case.seconds:
        local = case.start.astimezone(zone_for(case.zone))
        if local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset():
            # cronsim walks fixed-class jobs in naive wall time and answers with the first
            # pass: from 01:40 EST (second pass) on 2026-11-01 in New York, '50 1 * * *'
            # gives 01:50 EDT, 50 minutes *before* the start.
            return "fixed-class start in the second pass of a repeated hour"
    return None


# ---- strategies ---------------------------------------------------------------------------

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@dataclass(frozen=True)
class FieldSpec:
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0
    hot: tuple[int, int] | None = None  # values drawn more often (hours when DST happens)


SECOND = FieldSpec(0, 59, hot=(0, 2))
MINUTE = FieldSpec(0, 59, hot=(0, 1))
HOUR = FieldSpec(0, 23, hot=(0, 4))
DOM = FieldSpec(1, 31)
MONTH = FieldSpec(1, 12, _MONTH_NAMES, 1)
DOW = FieldSpec(0, 7, _DAY_NAMES, 0)


@st.composite
def _value(draw: st.DrawFn, spec: FieldSpec, low: int | None = None) -> tuple[int, str]:
    lo = spec.low if low is None else low
    values = st.integers(lo, spec.high)
    if spec.hot is not None and spec.hot[1] >= lo:
        values = st.one_of(values, st.integers(max(lo, spec.hot[0]), spec.hot[1]))
    value = draw(values)
    index = value - spec.name_base
    if spec.names and 0 <= index < len(spec.names) and draw(st.booleans()):
        name = spec.names[index]
        return value, draw(st.sampled_from((name, name.upper(), name.title())))
    return value, str(value)


@st.composite
def _item(draw: st.DrawFn, spec: FieldSpec) -> str:
    kinds = ["*", "*/n", "N", "N", "a-b", "a-b/n", "N/n"]
    if spec is DOM:
        kinds.append("L")
    if spec is DOW:
        kinds += ["N#k", "N#k"]
    kind = draw(st.sampled_from(kinds))
    step = str(draw(st.integers(1, spec.high - spec.low + 3)))
    if kind == "*":
        return "*"
    if kind == "*/n":
        return f"*/{step}"
    if kind == "L":
        return draw(st.sampled_from(("L", "l")))
    if kind == "N#k":
        _, text = draw(_value(spec))
        return f"{text}#{draw(st.integers(1, 5))}"
    low, low_text = draw(_value(spec))
    if kind == "N":
        return low_text
    if kind == "N/n":
        return f"{low_text}/{step}"
    # Ranges: an equal-bound range takes no step (cronsim deviation, see module doc).
    stepped = kind == "a-b/n"
    if stepped and low == spec.high:
        return f"{low_text}/{step}"
    _, high_text = draw(_value(spec, low + 1 if stepped else low))
    return f"{low_text}-{high_text}/{step}" if stepped else f"{low_text}-{high_text}"


def _field(spec: FieldSpec, star_weight: int) -> st.SearchStrategy[str]:
    items = st.lists(_item(spec), min_size=1, max_size=3).map(",".join)
    return st.one_of(*[st.just("*")] * star_weight, items)


@st.composite
def expressions(draw: st.DrawFn, seconds: bool) -> str:
    if draw(st.integers(0, 9)) == 0:
        word = draw(st.sampled_from(sorted(_DESCRIPTORS)))
        return draw(st.sampled_from((word, word.upper())))
    # Minute and hour decide the DST class: about half the expressions are fixed-class.
    fields = [
        draw(_field(MINUTE, 0)),
        draw(_field(HOUR, 0)),
        draw(_field(DOM, 3)),
        draw(_field(MONTH, 4)),
        draw(_field(DOW, 3)),
    ]
    if seconds:
        fields.insert(0, draw(_field(SECOND, 1)))
    return " ".join(fields)


def _offset(zone: tzinfo, instant: int) -> timedelta | None:
    return datetime.fromtimestamp(instant, zone).utcoffset()


@cache
def transitions(label: str, year: int) -> tuple[int, ...]:
    """The instants (Unix seconds) in ``year`` at which the zone's UTC offset changes."""
    zone = zone_for(label)
    first = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    found = []
    for lo in range(first, end, 86400):
        hi = min(lo + 86400, end)
        if _offset(zone, lo) != _offset(zone, hi):
            before = _offset(zone, lo)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(zone, mid) == before:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
    return tuple(found)


@st.composite
def starts(draw: st.DrawFn, zone: str) -> datetime:
    year = draw(st.integers(FIRST_YEAR, LAST_YEAR))
    near = transitions(zone, year)
    if draw(st.booleans()) and near:
        # Close to a DST transition: within a few hours, or a day or two before it.
        base = draw(st.sampled_from(near))
        delta = draw(st.one_of(st.integers(-3 * 3600, 3 * 3600), st.integers(-2 * 86400, 0)))
        instant = datetime.fromtimestamp(base + delta, UTC)
    else:
        first = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
        end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
        instant = datetime.fromtimestamp(draw(st.integers(first, end - 1)), UTC)
    if draw(st.integers(0, 4)) == 0:
        instant = instant.replace(microsecond=draw(st.integers(1, 999_999)))
    return instant


@st.composite
def cases(draw: st.DrawFn) -> Case:
    seconds = draw(st.integers(0, 3)) == 0
    expression = draw(expressions(seconds))
    probe = Case(expression, seconds, "UTC", datetime(2000, 1, 1, tzinfo=UTC))
    if seconds and not probe.is_wildcard_class():
        zone = draw(st.sampled_from(FIXED_ZONES))
    else:
        zone = draw(st.sampled_from(DST_ZONES + FIXED_ZONES))
    return Case(expression, seconds, zone, draw(starts(zone)))


# ---- the two implementations --------------------------------------------------------------


def construction_error(case: Case) -> str | None:
    try:
        cron(case.expression, seconds=case.seconds)
    except CronSyntaxError as exc:
        return str(exc)
    return None


def cronsim_never_fires(case: Case) -> bool:
    try:
        it = CronSim(" ".join(case.fields()), case.start)
    except CronSimError:
        return True
    return next(it, None) is None  # it gives up after 50 years


def replicron_fires(case: Case, horizon: datetime) -> list[datetime]:
    trigger = cron(case.expression, seconds=case.seconds, tz=zone_for(case.zone))
    start = case.start.astimezone(zone_for(case.zone))
    return [t for t in upcoming(trigger, start, FIRES) if t < horizon]


def cronsim_fires(case: Case, horizon: datetime) -> list[datetime]:
    start = case.start.astimezone(zone_for(case.zone))
    found: list[datetime] = []
    for fire in CronSim(" ".join(case.fields()), start):  # stops after 50 years without a fire
        instant = fire.astimezone(UTC)
        if instant >= horizon or len(found) == FIRES:
            break
        found.append(instant)
    return found


def z(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


NY, KYIV, SYDNEY, LONDON = "America/New_York", "Europe/Kyiv", "Australia/Sydney", "Europe/London"


@settings(max_examples=600, deadline=None)
@given(case=cases())
# Spring forward in New York (2026-03-08 02:00 EST -> 03:00 EDT, 07:00Z): gap slots of a
# fixed-class job collapse into 03:00 EDT; a wildcard job skips them.
@example(case=Case("0,20,40 2 * * *", False, NY, z(2026, 3, 8)))
@example(case=Case("*/20 2-3 * * *", False, NY, z(2026, 3, 8)))
# Fall back in Kyiv (2026-10-25 04:00 EEST -> 03:00 EET, 01:00Z): fixed-class runs once in
# the first pass, wildcard-class in both.
@example(case=Case("30 3 * * *", False, KYIV, z(2026, 10, 24, 23)))
@example(case=Case("30 * * * *", False, KYIV, z(2026, 10, 24, 23)))
# A wildcard-class start in the second pass (01:10 EST, New York 2026-11-01) is fine.
@example(case=Case("*/20 1 * * *", False, NY, z(2026, 11, 1, 6, 10)))
# Repeated midnight in Jerusalem (2004-09-22 01:00 +03 -> 00:00 +02, 22:00Z).
@example(case=Case("@daily", False, "Asia/Jerusalem", z(2004, 9, 21, 20)))
@example(case=Case("*/30 0 * * *", False, "Asia/Jerusalem", z(2004, 9, 21, 20)))
# Sydney: spring forward 2026-10-04 02:00 -> 03:00 AEDT, fall back 2026-04-05 03:00 -> 02:00.
@example(case=Case("15 2 * * sun", False, SYDNEY, z(2026, 10, 3)))
@example(case=Case("@hourly", False, SYDNEY, z(2026, 4, 4, 14)))
# Day fields: OR unless either starts with '*', 'L' and '#'.
@example(case=Case("0 0 */2 * 1", False, "UTC", z(2026, 1, 1)))
@example(case=Case("0 0 1-7 * mon", False, LONDON, z(2026, 3, 1)))
@example(case=Case("0 12 L feb *", False, "UTC", z(2027, 1, 1)))
@example(case=Case("0 9 * * MON#2,fri#5", False, NY, z(2026, 1, 1)))
@example(case=Case("0 0 * 2 mon#5", False, "UTC", z(2001, 1, 1)))  # Feb 2016 and 2044
@example(case=Case("* * */11 * 0#3", False, "UTC", z(2026, 1, 1)))  # never fires
@example(case=Case("* * * 30 2 *", True, "UTC", z(2026, 1, 1)))  # never fires
# Steps: from the start of their range, '*/7' restarts every hour, big step = first value.
@example(case=Case("1-30/7 */7 * * *", False, "UTC", z(2026, 1, 1)))
@example(case=Case("50/20 4/30 * * 5-7", False, KYIV, z(2026, 1, 1)))
# Seconds: wildcard-class in a DST zone, fixed-class in UTC and a fixed offset.
@example(case=Case("*/15 * 2 8 3 *", True, NY, z(2026, 3, 8, 6, 59, 30)))
@example(case=Case("*/15 30 2 * * *", True, "+05:45", z(2026, 3, 8)))
@example(case=Case("@daily", True, "UTC", z(2026, 3, 8)))
def test_fire_times_match_cronsim(case: Case) -> None:
    assume(cronsim_deviation(case) is None)
    horizon = case.start.replace(year=case.start.year + HORIZON_YEARS, month=1, day=1)
    rejection = construction_error(case)
    if rejection is not None:
        # Valid syntax, but the day fields can never match together: '0 0 30 2 *' (cronsim
        # rejects it too), '* * */11 * 0#3' (days 1, 12, 23 that are a third Sunday: cronsim
        # takes it but never fires).
        assert "can never fire" in rejection
        assert cronsim_never_fires(case)
        return
    ours = replicron_fires(case, horizon)
    theirs = cronsim_fires(case, horizon)
    if ours != theirs:
        zone = zone_for(case.zone)
        rows = [
            f"{i:2}  {_fmt(a, zone):<45} {_fmt(b, zone)}"
            for i, (a, b) in enumerate(zip_longest(ours, theirs))
        ]
        raise AssertionError(f"{case}\n    replicron{' ' * 37}cronsim\n" + "\n".join(rows))


def _fmt(instant: datetime | None, zone: tzinfo) -> str:
    if instant is None:
        return "-"
    return f"{instant:%Y-%m-%d %H:%M:%SZ} ({instant.astimezone(zone):%H:%M:%S%z})"


def test_zone_lists_fit_the_exclusions() -> None:
    # The DST zones shift by whole hours and no gap swallows local midnight, and the fixed
    # zones do not move at all, for every year a test may look at.
    for label in DST_ZONES + FIXED_ZONES:
        zone = zone_for(label)
        for year in range(FIRST_YEAR, LAST_YEAR + HORIZON_YEARS + 1):
            for instant in transitions(label, year):
                assert label in DST_ZONES, (label, instant)
                before, after = _offset(zone, instant - 1), _offset(zone, instant)
                assert before is not None
                assert after is not None
                shift = abs(after - before)
                assert shift == timedelta(hours=1), (label, instant, shift)
                if after > before:  # a gap: wall times [gap_start, gap_end) do not exist
                    gap_start = datetime.fromtimestamp(instant, UTC) + before
                    gap_end = datetime.fromtimestamp(instant, UTC) + after
                    midnight = gap_end.replace(hour=0, minute=0, second=0)
                    assert not gap_start <= midnight < gap_end, (label, instant)
    assert not set(EXCLUDED_ZONES) & set(DST_ZONES + FIXED_ZONES)


@pytest.mark.parametrize(
    ("case", "replicron_expected", "cronsim_actual"),
    [
        pytest.param(
            Case("5-5/4 * * * *", False, "UTC", z(2026, 1, 1)),
            [z(2026, 1, 1, 0, 5), z(2026, 1, 1, 1, 5)],
            [z(2026, 1, 1, 0, 5), z(2026, 1, 1, 0, 9)],
            id="equal-bound stepped range: cronsim reads 5-5/4 as 5/4",
        ),
        pytest.param(
            # 06:40Z = 01:40 EST, second pass; cronsim answers 01:50 EDT, before the start.
            Case("50 1 * * *", False, NY, z(2026, 11, 1, 6, 40)),
            [z(2026, 11, 2, 6, 50), z(2026, 11, 3, 6, 50)],
            [z(2026, 11, 1, 5, 50), z(2026, 11, 2, 6, 50)],
            id="fixed-class start in the second pass: cronsim goes back in time",
        ),
        pytest.param(
            # 02:30:00 is in the gap; replicron runs it at 03:00 EDT like a 5-field job.
            Case("0 30 2 * * *", True, NY, z(2026, 3, 8)),
            [z(2026, 3, 8, 7), z(2026, 3, 9, 6, 30)],
            [z(2026, 3, 9, 6, 30), z(2026, 3, 10, 6, 30)],
            id="6-field fixed-class in a DST zone: cronsim skips the gap slot",
        ),
        pytest.param(
            # Fall-back 02:00 +11:00 -> 01:30 +10:30 at 15:00Z; 02:00 +10:30 is real.
            Case("*/30 2 * * *", False, "Australia/Lord_Howe", z(2026, 4, 4, 14)),
            [z(2026, 4, 4, 15, 30), z(2026, 4, 4, 16)],
            [z(2026, 4, 4, 16), z(2026, 4, 5, 15, 30)],
            id="30-minute DST shift (Lord Howe): cronsim misses 02:00",
        ),
        pytest.param(
            # Fall-back 03:45 +13:45 -> 02:45 +12:45 at 14:00Z; hour 2 matches '*/2'.
            Case("* */2 * * *", False, "Pacific/Chatham", z(2026, 4, 4, 13, 59)),
            [z(2026, 4, 4, 14), z(2026, 4, 4, 14, 1)],
            [z(2026, 4, 4, 15, 15), z(2026, 4, 4, 15, 16)],
            id="45-minute offset (Chatham): cronsim skips the repeated 02:45-02:59",
        ),
        pytest.param(
            # 2026-09-06 00:00 -04:00 -> 01:00 -03:00: hour 0 does not exist that Sunday.
            Case("* 0 * * 0", False, "America/Santiago", z(2026, 9, 6, 3, 59, 58)),
            [z(2026, 9, 13, 3), z(2026, 9, 13, 3, 1)],
            [z(2026, 9, 6, 4), z(2026, 9, 13, 3)],
            id="missing midnight (Santiago): cronsim fires at 01:00",
        ),
    ],
)
def test_excluded_cronsim_deviations_are_real(
    case: Case, replicron_expected: list[datetime], cronsim_actual: list[datetime]
) -> None:
    # Each exclusion above rests on cronsim being wrong (or different by design) there; if
    # this fails after a cronsim upgrade, the exclusion can go.
    horizon = z(2100, 1, 1)
    assert replicron_fires(case, horizon)[:2] == replicron_expected
    assert cronsim_fires(case, horizon)[:2] == cronsim_actual
