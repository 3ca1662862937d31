"""daily(), weekly(), monthly() and once()."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

import pytest

from replicron import (
    InvalidDayError,
    InvalidIntervalError,
    InvalidTimeOfDayError,
    InvalidTimezoneError,
    NaiveDatetimeError,
    PastInstantError,
    ReplicronError,
    WallClockTrigger,
    cron,
    daily,
    monthly,
    once,
    upcoming,
    weekly,
)
from tests.helpers import z

KYIV = ZoneInfo("Europe/Kyiv")


def test_daily_at_one_and_several_times() -> None:
    assert list(upcoming(daily("09:30"), z(2026, 1, 1, 10), 2)) == [
        z(2026, 1, 2, 9, 30),
        z(2026, 1, 3, 9, 30),
    ]
    trigger = daily(["18:00", time(6, 0), "12:00:30"])
    assert list(upcoming(trigger, z(2026, 1, 1), 4)) == [
        z(2026, 1, 1, 6),
        z(2026, 1, 1, 12, 0, 30),
        z(2026, 1, 1, 18),
        z(2026, 1, 2, 6),
    ]
    assert daily().next_after(z(2026, 1, 1, 5)) == z(2026, 1, 2)


def test_daily_in_a_zone() -> None:
    # 07:00 in Kyiv is 05:00Z in winter (EET, +2) and 04:00Z in summer (EEST, +3).
    trigger = daily("07:00", tz="Europe/Kyiv")
    assert trigger.next_after(z(2026, 1, 10)) == z(2026, 1, 10, 5)
    assert trigger.next_after(z(2026, 7, 10)) == z(2026, 7, 10, 4)


def test_daily_every_n_days_is_anchored() -> None:
    # Days since 1970-01-01: 2026-01-01 is day 20454 = 3 * 6818, so it is on the grid.
    assert (date(2026, 1, 1) - date(1970, 1, 1)).days == 3 * 6818
    trigger = daily("08:00", every_n_days=3)
    assert list(upcoming(trigger, z(2025, 12, 31), 3)) == [
        z(2026, 1, 1, 8),
        z(2026, 1, 4, 8),
        z(2026, 1, 7, 8),
    ]
    shifted = daily("08:00", every_n_days=3, anchor=date(2026, 1, 2))
    assert shifted.next_after(z(2025, 12, 31)) == z(2026, 1, 2, 8)
    # Across a month end the count continues: 2026-01-31 then 2026-02-03.
    assert list(upcoming(trigger, z(2026, 1, 30), 2)) == [z(2026, 1, 31, 8), z(2026, 2, 3, 8)]


def test_weekly_days_by_name_and_number() -> None:
    # 2026-01-05 is a Monday.
    assert date(2026, 1, 5).weekday() == 0
    trigger = weekly(["mon", "Friday", 2], "10:00")
    assert list(upcoming(trigger, z(2026, 1, 5), 4)) == [
        z(2026, 1, 5, 10),
        z(2026, 1, 7, 10),
        z(2026, 1, 9, 10),
        z(2026, 1, 12, 10),
    ]
    assert weekly("sun").next_after(z(2026, 1, 5)) == z(2026, 1, 11)
    assert weekly(6).next_after(z(2026, 1, 5)) == z(2026, 1, 11)


def test_monthly_positive_and_negative_days() -> None:
    trigger = monthly([1, 15, -1], "12:00")
    assert list(upcoming(trigger, z(2026, 2, 1, 13), 4)) == [
        z(2026, 2, 15, 12),
        z(2026, 2, 28, 12),
        z(2026, 3, 1, 12),
        z(2026, 3, 15, 12),
    ]
    assert monthly(-1).next_after(z(2028, 2, 1)) == z(2028, 2, 29)
    assert monthly(-2).next_after(z(2026, 4, 1)) == z(2026, 4, 29)


def test_monthly_skips_months_without_the_day() -> None:
    assert list(upcoming(monthly(31), z(2026, 1, 31, 1), 3)) == [
        z(2026, 3, 31),
        z(2026, 5, 31),
        z(2026, 7, 31),
    ]
    assert list(upcoming(monthly(-30), z(2026, 1, 3), 2)) == [z(2026, 3, 2), z(2026, 4, 1)]


def test_once_fires_at_each_instant_once() -> None:
    now = z(2026, 1, 1)
    kyiv_noon = datetime(2026, 2, 1, 12, tzinfo=KYIV)
    trigger = once(z(2026, 3, 1), kyiv_noon, z(2026, 3, 1), now=now)
    assert list(upcoming(trigger, now, 5)) == [z(2026, 2, 1, 10), z(2026, 3, 1)]
    assert trigger.next_after(z(2026, 3, 1)) is None
    assert trigger.instants == (z(2026, 2, 1, 10), z(2026, 3, 1))


def test_once_rejects_past_and_naive_instants() -> None:
    now = z(2026, 1, 1)
    with pytest.raises(PastInstantError, match=r"2025-12-31T23:59:59.*in the past"):
        once(z(2026, 2, 1), z(2025, 12, 31, 23, 59, 59), now=now)
    with pytest.raises(PastInstantError):
        once(z(2000, 1, 1))  # against the system clock
    with pytest.raises(NaiveDatetimeError):
        once(datetime(2030, 1, 1), now=now)
    assert once(now, now=now).next_after(now - timedelta(seconds=1)) == now


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("24:00", "hour 24 .* out of range 0-23"),
        ("12:60", "minute 60 .* out of range 0-59"),
        ("12:00:60", "second 60 .* out of range 0-59"),
        ("noon", "not 'HH:MM'"),
        ("12", "not 'HH:MM'"),
        ("12:0", "not 'HH:MM'"),
        ("-1:00", "not 'HH:MM'"),
        ([], "at least one"),
        (1200, "must be 'HH:MM'"),
        (time(12, 0, tzinfo=UTC), "time zone"),
        (time(12, 0, 0, 5), "fractions of a second"),
    ],
)
def test_bad_times_of_day(at: object, message: str) -> None:
    with pytest.raises(InvalidTimeOfDayError, match=message) as info:
        daily(at)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ReplicronError)


@pytest.mark.parametrize(
    ("days", "message"),
    [
        (7, "out of range 0-6"),
        (-1, "out of range 0-6"),
        ("mo", "unknown weekday"),
        ("funday", "unknown weekday"),
        ([], "at least one"),
        ([1.5], "name or a number"),
        (None, "a day or a list"),
    ],
)
def test_bad_weekdays(days: object, message: str) -> None:
    with pytest.raises(InvalidDayError, match=message):
        weekly(days)


@pytest.mark.parametrize(
    ("days", "message"),
    [
        (0, "out of range"),
        (32, "out of range"),
        (-32, "out of range"),
        ([1, 40], "40 is out of range"),
        ([], "at least one"),
        (["1"], "whole number"),
        (True, "whole number"),
    ],
)
def test_bad_month_days(days: object, message: str) -> None:
    with pytest.raises(InvalidDayError, match=message):
        monthly(days)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_every_n_days(value: object) -> None:
    with pytest.raises(InvalidIntervalError, match="every_n_days"):
        daily("08:00", every_n_days=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus_Mons", "", " UTC", "../../etc/passwd", "Europe/", 42]
)
def test_unknown_time_zones_fail_at_construction(zone: object) -> None:
    with pytest.raises(InvalidTimezoneError) as info:
        cron("0 * * * *", tz=zone)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidTimezoneError):
        daily("08:00", tz=zone)  # type: ignore[arg-type]


def test_time_zone_forms() -> None:
    fixed = timezone(timedelta(hours=5, minutes=30))
    zones: list[str | tzinfo] = ["Asia/Kolkata", ZoneInfo("Asia/Kolkata"), fixed]
    for zone in zones:
        assert daily("05:30", tz=zone).next_after(z(2026, 1, 1)) == z(2026, 1, 2)
    assert daily("05:30", tz="UTC").next_after(z(2026, 1, 1)) == z(2026, 1, 1, 5, 30)


def test_default_zone_is_utc_until_a_scheduler_supplies_one() -> None:
    trigger = cron("0 9 * * *")
    assert trigger.tz is None
    assert trigger.next_after(z(2026, 1, 1)) == z(2026, 1, 1, 9)
    in_kyiv = trigger.with_default_timezone("Europe/Kyiv")
    assert isinstance(in_kyiv, WallClockTrigger)
    assert in_kyiv.next_after(z(2026, 1, 1)) == z(2026, 1, 1, 7)
    assert in_kyiv.with_default_timezone("Asia/Tokyo") is in_kyiv
    assert trigger.tz is None  # the original is unchanged
    with pytest.raises(InvalidTimezoneError):
        trigger.with_default_timezone("Nowhere/Special")


def test_calendar_triggers_are_comparable_and_readable() -> None:
    assert daily("9:00") == daily(time(9))
    assert weekly(["mon", 4]) == weekly([0, "fri"])
    assert monthly([1, -1], tz="Europe/Kyiv") != monthly([1, -1])
    assert repr(daily("09:00", every_n_days=2)) == "daily(at='09:00:00', every_n_days=2)"
    assert repr(weekly("mon", ["10:00", "09:00"])) == (
        "weekly(days=[0], at=['09:00:00', '10:00:00'])"
    )
    assert repr(monthly(-1, tz="Europe/Kyiv")) == (
        "monthly(days=[-1], at='00:00:00', tz='Europe/Kyiv')"
    )
    assert repr(cron("*/5 * * * *", tz="UTC")) == "cron('*/5 * * * *', tz='UTC')"
    with pytest.raises(AttributeError):
        daily().tz = None
