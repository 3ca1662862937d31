"""Invariants every trigger keeps, over random zones, expressions and instants.

* ``next_after(t)`` is strictly after ``t``;
* nothing fires between ``t`` and ``next_after(t)``: any start in between gives the same
  next tick, so the sequence from any start is a suffix of the sequence from an earlier one;
* the result is a real instant: its wall time exists in the zone and, for wildcard-class
  cron, matches the expression.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from replicron import cron, daily, every, monthly, weekly
from replicron.triggers import Trigger

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Kyiv",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Sao_Paulo",
    "Pacific/Apia",
    "Asia/Kolkata",
    "America/St_Johns",
]
EXPRESSIONS = [
    "*/5 * * * *",
    "0 3 * * 1-5",
    "30 2 * * *",
    "0,30 1-3 * * *",
    "15 * * * *",
    "0 */2 * * *",
    "0 0 L * *",
    "0 12 * * mon#2",
    "0 0 */2 * 1",
    "@hourly",
    "@daily",
]

instants = st.datetimes(
    min_value=datetime(1995, 1, 1), max_value=datetime(2045, 1, 1), timezones=st.just(UTC)
)


def triggers() -> st.SearchStrategy[Trigger]:
    zone = st.sampled_from(ZONES)
    return st.one_of(
        st.builds(lambda e, tz: cron(e, tz=tz), st.sampled_from(EXPRESSIONS), zone),
        st.builds(lambda tz: daily(["01:30", "02:30", "12:00"], tz=tz), zone),
        st.builds(lambda tz: weekly(["sun", "wed"], "02:15", tz=tz), zone),
        st.builds(lambda tz: monthly([1, -1], "00:00", tz=tz), zone),
        st.integers(1, 100_000).flatmap(
            lambda s: st.builds(
                lambda j: every(seconds=s, jitter=timedelta(seconds=j)).for_job("job"),
                st.integers(0, s - 1),
            )
        ),
        st.builds(
            lambda lo, extra: every(
                between=(timedelta(seconds=lo), timedelta(seconds=lo + extra))
            ).for_job("random"),
            st.integers(1, 5000),
            st.integers(1, 5000),
        ),
    )


@settings(max_examples=300, deadline=None)
@given(triggers(), instants, st.floats(0, 1))
def test_next_after_is_strict_and_nothing_fires_in_between(
    trigger: Trigger, start: datetime, fraction: float
) -> None:
    first = trigger.next_after(start)
    assert first is not None
    assert first > start
    assert first.tzinfo is UTC
    between = start + (first - start) * fraction
    if between < first:
        assert trigger.next_after(between) == first
    second = trigger.next_after(first)
    assert second is not None
    assert second > first
    # Suffix: starting just before `first` gives first then second.
    assert trigger.next_after(first - timedelta(microseconds=1)) == first


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ZONES), st.sampled_from(EXPRESSIONS), instants)
def test_cron_ticks_are_real_instants(zone_name: str, expression: str, start: datetime) -> None:
    zone = ZoneInfo(zone_name)
    trigger = cron(expression, tz=zone_name)
    current = start
    for _ in range(5):
        found = trigger.next_after(current)
        assert found is not None
        local = found.astimezone(zone)
        # The wall time exists: it converts back to the same instant with one of its folds.
        naive = local.replace(tzinfo=None)
        assert found in {naive.replace(tzinfo=zone, fold=f).astimezone(UTC) for f in (0, 1)}
        current = found


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ZONES), instants)
def test_wildcard_cron_matches_wall_time_and_fires_every_matching_instant(
    zone_name: str, start: datetime
) -> None:
    zone = ZoneInfo(zone_name)
    trigger = cron("*/15 * * * *", tz=zone_name)
    found = trigger.next_after(start)
    assert found is not None
    assert found.astimezone(zone).minute % 15 == 0
    assert found.second == 0
    # Brute force: the first instant after `start`, on a whole minute, whose local minute is
    # a multiple of 15 (real instants only, so gaps are skipped and repeats count twice).
    probe = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while probe.astimezone(zone).minute % 15 != 0:
        probe += timedelta(minutes=1)
    assert found == probe
