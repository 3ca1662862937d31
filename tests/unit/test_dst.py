"""DST and zone transitions, on real tz data, as docs/triggers.md describes them.

Expected instants are written out by hand as UTC times (with the local wall time beside
them), from the published transition dates of each zone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from replicron import cron, daily, monthly, upcoming, weekly
from replicron.testing import FakeClock
from replicron.triggers import Trigger
from tests.helpers import z


def ticks(trigger: Trigger, after: datetime, count: int) -> list[datetime]:
    return list(upcoming(trigger, after, count))


NEW_YORK = "America/New_York"  # 2026: EST->EDT at 07:00Z on 03-08, EDT->EST at 06:00Z on 11-01
KYIV = "Europe/Kyiv"  # 2026: EET->EEST at 01:00Z on 03-29, EEST->EET at 01:00Z on 10-25
LORD_HOWE = "Australia/Lord_Howe"  # +10:30 / +11:00, 30-minute shifts at 02:00 local
CHATHAM = "Pacific/Chatham"  # +12:45 / +13:45, 02:45 -> 03:45 on 2026-09-27


def test_transition_dates_used_here_are_real() -> None:
    # Guards the hand-written expectations below against a different tz database.
    ny, kyiv = ZoneInfo(NEW_YORK), ZoneInfo(KYIV)
    assert z(2026, 3, 8, 6, 59).astimezone(ny).utcoffset() == timedelta(hours=-5)
    assert z(2026, 3, 8, 7).astimezone(ny).utcoffset() == timedelta(hours=-4)
    assert z(2026, 11, 1, 5, 59).astimezone(ny).utcoffset() == timedelta(hours=-4)
    assert z(2026, 11, 1, 6).astimezone(ny).utcoffset() == timedelta(hours=-5)
    assert z(2026, 3, 29, 1).astimezone(kyiv).utcoffset() == timedelta(hours=3)
    assert z(2026, 10, 25, 1).astimezone(kyiv).utcoffset() == timedelta(hours=2)


# ---- spring forward -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "zone", "after", "expected"),
    [
        pytest.param(
            "30 2 * * *",
            NEW_YORK,
            z(2026, 3, 7),
            [z(2026, 3, 7, 7, 30), z(2026, 3, 8, 7), z(2026, 3, 9, 6, 30)],
            id="fixed slot in the gap runs at the first instant after it (03:00 EDT)",
        ),
        pytest.param(
            "0,20,40 2 * * *",
            NEW_YORK,
            z(2026, 3, 8),
            [z(2026, 3, 8, 7), z(2026, 3, 9, 6), z(2026, 3, 9, 6, 20)],
            id="several fixed gap slots collapse into one instant",
        ),
        pytest.param(
            "0 3 * * *",
            NEW_YORK,
            z(2026, 3, 8),
            [z(2026, 3, 8, 7), z(2026, 3, 9, 7)],
            id="slot right after the gap is not doubled",
        ),
        pytest.param(
            "*/30 * * * *",
            NEW_YORK,
            z(2026, 3, 8, 5, 45),
            [z(2026, 3, 8, 6), z(2026, 3, 8, 6, 30), z(2026, 3, 8, 7), z(2026, 3, 8, 7, 30)],
            id="wildcard skips gap slots (01:00 01:30 EST, then 03:00 03:30 EDT)",
        ),
        pytest.param(
            "30 * * * *",
            NEW_YORK,
            z(2026, 3, 8, 5),
            [z(2026, 3, 8, 5, 30), z(2026, 3, 8, 6, 30), z(2026, 3, 8, 7, 30)],
            id="hourly wildcard loses 02:30",
        ),
        pytest.param(
            "30 3 * * *",
            KYIV,
            z(2026, 3, 28),
            [z(2026, 3, 28, 1, 30), z(2026, 3, 29, 1), z(2026, 3, 30, 0, 30)],
            id="kyiv fixed 03:30 runs at 04:00 EEST",
        ),
        pytest.param(
            "*/20 * * * *",
            KYIV,
            z(2026, 3, 29, 0, 30),
            [z(2026, 3, 29, 0, 40), z(2026, 3, 29, 1), z(2026, 3, 29, 1, 20)],
            id="kyiv wildcard jumps from 02:40 EET to 04:00 EEST",
        ),
        pytest.param(
            "15 2 * * *",
            LORD_HOWE,
            z(2026, 10, 3),
            [z(2026, 10, 3, 15, 30), z(2026, 10, 4, 15, 15)],
            id="lord howe 30-minute gap: fixed 02:15 runs at 02:30 +11",
        ),
        pytest.param(
            "*/15 * * * *",
            LORD_HOWE,
            z(2026, 10, 3, 15, 10),
            [z(2026, 10, 3, 15, 15), z(2026, 10, 3, 15, 30), z(2026, 10, 3, 15, 45)],
            id="lord howe wildcard: 01:45 +10:30 then 02:30 +11",
        ),
        pytest.param(
            "0 3 * * *",
            CHATHAM,
            z(2026, 9, 26),
            [z(2026, 9, 26, 14), z(2026, 9, 27, 13, 15)],
            id="chatham 45-minute zone: fixed 03:00 in the gap runs at 03:45 +13:45",
        ),
        pytest.param(
            "0 0 * * *",
            "America/Sao_Paulo",
            z(2018, 11, 3),
            [z(2018, 11, 3, 3), z(2018, 11, 4, 3), z(2018, 11, 5, 2)],
            id="missing midnight (sao paulo 2018): fixed midnight runs at 01:00 -02",
        ),
        pytest.param(
            "0 * * * *",
            "America/Sao_Paulo",
            z(2018, 11, 4, 1, 30),
            [z(2018, 11, 4, 2), z(2018, 11, 4, 3), z(2018, 11, 4, 4)],
            id="missing midnight, wildcard: 23:00 -03 then 01:00 -02",
        ),
    ],
)
def test_spring_forward(
    expression: str, zone: str, after: datetime, expected: list[datetime]
) -> None:
    assert ticks(cron(expression, tz=zone), after, len(expected)) == expected


# ---- fall back ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "zone", "after", "expected"),
    [
        pytest.param(
            "30 1 * * *",
            NEW_YORK,
            z(2026, 11, 1),
            [z(2026, 11, 1, 5, 30), z(2026, 11, 2, 6, 30)],
            id="fixed slot in the repeated hour runs once, in the first pass",
        ),
        pytest.param(
            "30 1 * * *",
            NEW_YORK,
            z(2026, 11, 1, 6, 10),
            [z(2026, 11, 2, 6, 30)],
            id="start in the second pass: no run of the already-lived 01:30",
        ),
        pytest.param(
            "30 1 * * *",
            NEW_YORK,
            z(2026, 11, 1, 5, 30),
            [z(2026, 11, 2, 6, 30)],
            id="start exactly on the first-pass tick",
        ),
        pytest.param(
            "*/30 * * * *",
            NEW_YORK,
            z(2026, 11, 1, 4, 45),
            [
                z(2026, 11, 1, 5),  # 01:00 EDT
                z(2026, 11, 1, 5, 30),  # 01:30 EDT
                z(2026, 11, 1, 6),  # 01:00 EST
                z(2026, 11, 1, 6, 30),  # 01:30 EST
                z(2026, 11, 1, 7),  # 02:00 EST
            ],
            id="wildcard runs in both passes",
        ),
        pytest.param(
            "*/30 * * * *",
            NEW_YORK,
            z(2026, 11, 1, 6, 10),
            [z(2026, 11, 1, 6, 30), z(2026, 11, 1, 7)],
            id="wildcard from inside the second pass",
        ),
        pytest.param(
            "0 1-3 * * *",
            NEW_YORK,
            z(2026, 10, 31, 12),
            [z(2026, 11, 1, 5), z(2026, 11, 1, 7), z(2026, 11, 1, 8), z(2026, 11, 2, 6)],
            id="fixed hour list: 01:00 EDT only, then 02:00 and 03:00 EST",
        ),
        pytest.param(
            "15 3 * * *",
            KYIV,
            z(2026, 10, 24, 12),
            [z(2026, 10, 25, 0, 15), z(2026, 10, 26, 1, 15)],
            id="kyiv fixed 03:15 once, in EEST",
        ),
        pytest.param(
            "15 * * * *",
            KYIV,
            z(2026, 10, 25),
            [z(2026, 10, 25, 0, 15), z(2026, 10, 25, 1, 15), z(2026, 10, 25, 2, 15)],
            id="kyiv wildcard 03:15 twice",
        ),
        pytest.param(
            "45 1 * * *",
            LORD_HOWE,
            z(2026, 4, 4),
            [z(2026, 4, 4, 14, 45), z(2026, 4, 5, 15, 15)],
            id="lord howe 30-minute repeat: fixed 01:45 once (+11)",
        ),
        pytest.param(
            "45 * * * *",
            LORD_HOWE,
            z(2026, 4, 4, 14),
            [z(2026, 4, 4, 14, 45), z(2026, 4, 4, 15, 15), z(2026, 4, 4, 16, 15)],
            id="lord howe wildcard 01:45 in both passes",
        ),
    ],
)
def test_fall_back(expression: str, zone: str, after: datetime, expected: list[datetime]) -> None:
    assert ticks(cron(expression, tz=zone), after, len(expected)) == expected


def test_seconds_cron_in_the_gap_follows_its_minute_and_hour_class() -> None:
    # Fixed-class (minute and hour fixed): both gap slots collapse into 03:00 EDT.
    fixed = cron("0,30 30 2 * * *", seconds=True, tz=NEW_YORK)
    assert ticks(fixed, z(2026, 3, 8), 2) == [z(2026, 3, 8, 7), z(2026, 3, 9, 6, 30)]
    # Wildcard-class: every 20 s of the hour, the gap hour simply does not happen.
    wild = cron("*/20 59 * * * *", seconds=True, tz=NEW_YORK)
    assert ticks(wild, z(2026, 3, 8, 6, 59, 30), 3) == [
        z(2026, 3, 8, 6, 59, 40),
        z(2026, 3, 8, 7, 59),
        z(2026, 3, 8, 7, 59, 20),
    ]


# ---- a zone that skips a whole day ------------------------------------------------------


def test_apia_skips_2011_12_30() -> None:
    apia = ZoneInfo("Pacific/Apia")
    # 2011-12-29 23:59:59 -10:00 is followed by 2011-12-31 00:00:00 +14:00 (10:00Z).
    assert z(2011, 12, 30, 9, 59, 59).astimezone(apia) == datetime(
        2011, 12, 29, 23, 59, 59, tzinfo=apia
    )
    assert z(2011, 12, 30, 10).astimezone(apia) == datetime(2011, 12, 31, tzinfo=apia)
    # A jump of three hours or more is not DST-like: the lost day's slots are skipped by both
    # classes, as Debian's cron does for large clock changes.
    assert ticks(cron("0 12 * * *", tz="Pacific/Apia"), z(2011, 12, 29), 2) == [
        z(2011, 12, 29, 22),  # 12:00 -10:00 on the 29th
        z(2011, 12, 30, 22),  # 12:00 +14:00 on the 31st
    ]
    assert ticks(cron("0 */6 * * *", tz="Pacific/Apia"), z(2011, 12, 30, 3), 3) == [
        z(2011, 12, 30, 4),  # 18:00 -10:00 on the 29th
        z(2011, 12, 30, 10),  # 00:00 +14:00 on the 31st
        z(2011, 12, 30, 16),
    ]
    assert ticks(daily("12:00", tz="Pacific/Apia"), z(2011, 12, 29), 2) == [
        z(2011, 12, 29, 22),
        z(2011, 12, 30, 22),
    ]
    # Day-of-month 30 simply does not occur in Apia in December 2011.
    assert ticks(cron("0 12 30 12 *", tz="Pacific/Apia"), z(2011, 12, 1), 1) == [
        z(2012, 12, 29, 22)  # 12:00 +14:00 (summer time) on 2012-12-30
    ]


# ---- calendar triggers are fixed-class ---------------------------------------------------


def test_calendar_triggers_in_gap_and_repeated_hour() -> None:
    assert ticks(daily("02:30", tz=NEW_YORK), z(2026, 3, 8), 2) == [
        z(2026, 3, 8, 7),
        z(2026, 3, 9, 6, 30),
    ]
    assert ticks(daily("01:30", tz=NEW_YORK), z(2026, 11, 1), 2) == [
        z(2026, 11, 1, 5, 30),
        z(2026, 11, 2, 6, 30),
    ]
    assert ticks(weekly("sun", "02:30", tz=NEW_YORK), z(2026, 3, 1, 8), 2) == [
        z(2026, 3, 8, 7),
        z(2026, 3, 15, 6, 30),
    ]
    assert ticks(monthly(8, "02:10", tz=NEW_YORK), z(2026, 3, 1), 2) == [
        z(2026, 3, 8, 7),
        z(2026, 4, 8, 6, 10),
    ]


# ---- driven by a fake clock --------------------------------------------------------------


def test_fake_clock_walk_through_both_transitions_of_a_year() -> None:
    """Step a FakeClock minute by minute through 2026's transitions in New York, firing
    whatever is due, as a scheduler loop would; count runs per local date."""
    fixed, wild = cron("30 1,2 * * *", tz=NEW_YORK), cron("30 * * * *", tz=NEW_YORK)
    for day, fixed_runs, wild_runs in [((3, 8), 1 + 1, 23), ((11, 1), 1 + 1, 25)]:
        start = datetime(2026, *day, tzinfo=ZoneInfo(NEW_YORK))
        clock = FakeClock(start)
        fired: dict[str, list[datetime]] = {"fixed": [], "wild": []}
        due = {"fixed": fixed.next_after(clock.now()), "wild": wild.next_after(clock.now())}
        triggers = {"fixed": fixed, "wild": wild}
        end = start + timedelta(hours=25)
        while clock.now() < end:
            clock.advance(timedelta(minutes=1))
            for name, when in due.items():
                if when is not None and when <= clock.now():
                    fired[name].append(when)
                    due[name] = triggers[name].next_after(when)
        local_day = [t for t in fired["fixed"] if t.astimezone(ZoneInfo(NEW_YORK)).day == day[1]]
        assert len(local_day) == fixed_runs
        wild_day = [t for t in fired["wild"] if t.astimezone(ZoneInfo(NEW_YORK)).day == day[1]]
        assert len(wild_day) == wild_runs
        assert len(set(fired["fixed"])) == len(fired["fixed"])
