"""Triggers: when a job's ticks fall.

A trigger is an immutable object with one pure method, ``next_after(instant)``: the first
tick strictly after an aware ``instant``, as an aware UTC datetime, or ``None`` when there is
no further tick. It reads no clock and keeps no state, so every replica computes the same
ticks. Build triggers with :func:`cron`, :func:`every`, :func:`daily`, :func:`weekly`,
:func:`monthly` and :func:`once`; bad input raises at construction. The ticks of
:func:`after` (fixed delay) follow the finishes in the ledger: ``next_after`` gives its first.
"""

from __future__ import annotations

import dataclasses
import itertools
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any, Protocol, Self, cast, runtime_checkable

from ._schedule import calendar as _calendar
from ._schedule.calendar import TimeOfDay
from ._schedule.cron import parse_cron
from ._schedule.interval import IntervalRule, make_interval_rule
from ._schedule.tz import UTC, from_unix, resolve_zone, timeline_for, to_unix, zone_name
from ._schedule.walltime import DayRule, ListTimes, WallSchedule, next_instant
from .errors import ArgumentTypeError, InvalidIntervalError, NaiveDatetimeError, PastInstantError
from .keys import check_job_name

__all__ = [
    "CronTrigger",
    "DailyTrigger",
    "FixedDelayTrigger",
    "IntervalTrigger",
    "MonthlyTrigger",
    "OneTimeTrigger",
    "Trigger",
    "WallClockTrigger",
    "WeeklyTrigger",
    "after",
    "cron",
    "daily",
    "every",
    "monthly",
    "once",
    "upcoming",
    "weekly",
]


@runtime_checkable
class Trigger(Protocol):
    """Anything with a pure ``next_after``; replicron's own triggers and user-written ones."""

    def next_after(self, instant: datetime, /) -> datetime | None:
        """The first tick strictly after ``instant`` (aware), in UTC, or ``None``."""
        ...


def upcoming(trigger: Trigger, after: datetime, count: int) -> Iterator[datetime]:
    """Up to ``count`` consecutive ticks of ``trigger`` after ``after``."""
    current = after
    for _ in range(count):
        found = trigger.next_after(current)
        if found is None:
            return
        yield found
        current = found


def require_aware(instant: object, what: str = "instant") -> datetime:
    if not isinstance(instant, datetime):
        raise ArgumentTypeError(f"{what} must be a datetime, not {type(instant).__name__}")
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise NaiveDatetimeError(
            f"{what} {instant.isoformat()} has no time zone; pass an aware datetime "
            "(e.g. datetime.now(timezone.utc))"
        )
    return instant


class _Frozen:
    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _init(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @abstractmethod
    def _identity(self) -> tuple[object, ...]: ...

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self._identity()))


class WallClockTrigger(_Frozen, ABC):
    """Base of the triggers that follow the local wall clock of a time zone.

    ``tz=None`` means "the scheduler's zone" (UTC until a scheduler supplies another through
    :meth:`with_default_timezone`).
    """

    __slots__ = ("_schedule", "_wildcard", "tz")
    tz: tzinfo | None
    _schedule: WallSchedule
    _wildcard: bool

    @property
    def zone(self) -> tzinfo:
        return self.tz if self.tz is not None else UTC

    def next_after(self, instant: datetime, /) -> datetime | None:
        lo = to_unix(require_aware(instant)) + 1
        found = next_instant(self._schedule, timeline_for(self.zone), lo, wildcard=self._wildcard)
        return None if found is None else from_unix(found)

    def with_default_timezone(self, tz: str | tzinfo) -> WallClockTrigger:
        """This trigger, or a copy in ``tz`` if it was built without a zone."""
        if self.tz is not None:
            return self
        copy = object.__new__(type(self))
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if hasattr(self, slot):
                    object.__setattr__(copy, slot, getattr(self, slot))
        object.__setattr__(copy, "tz", resolve_zone(tz))
        return copy

    def _tz_repr(self) -> str:
        return "" if self.tz is None else f", tz={zone_name(self.tz)!r}"


class CronTrigger(WallClockTrigger):
    """A cron expression (Debian cron's meaning; see docs/cron.md)."""

    __slots__ = ("expression", "seconds")
    expression: str
    seconds: bool

    def __init__(self, expression: str, *, seconds: bool = False, tz: str | tzinfo | None = None):
        parsed = parse_cron(expression, seconds=seconds)
        self._init(
            expression=expression,
            seconds=seconds,
            tz=resolve_zone(tz),
            _schedule=parsed.schedule,
            _wildcard=parsed.wildcard,
        )

    def _identity(self) -> tuple[object, ...]:
        return (self.expression, self.seconds, self.tz)

    def __repr__(self) -> str:
        extra = ", seconds=True" if self.seconds else ""
        return f"cron({self.expression!r}{extra}{self._tz_repr()})"


class _CalendarTrigger(WallClockTrigger):
    """Daily, weekly and monthly triggers: fixed times of day, fixed-class under DST."""

    __slots__ = ("at",)
    at: tuple[time, ...]

    def _setup(self, rule: DayRule, at: Any, tz: str | tzinfo | None, **fields: object) -> None:
        seconds = _calendar.parse_times_of_day(at)
        self._init(
            at=tuple(time(s // 3600, s // 60 % 60, s % 60) for s in seconds),
            tz=resolve_zone(tz),
            _schedule=WallSchedule(rule, ListTimes(seconds)),
            _wildcard=False,
            **fields,
        )

    def _at_repr(self) -> str:
        texts = [t.isoformat() for t in self.at]
        return repr(texts[0]) if len(texts) == 1 else repr(texts)


class DailyTrigger(_CalendarTrigger):
    __slots__ = ("anchor", "every_n_days")
    every_n_days: int
    anchor: date

    def __init__(
        self,
        at: TimeOfDay | Iterable[TimeOfDay] = "00:00",
        *,
        every_n_days: int = 1,
        anchor: date = date(1970, 1, 1),
        tz: str | tzinfo | None = None,
    ) -> None:
        n = _calendar.parse_positive(every_n_days, "every_n_days")
        if not isinstance(anchor, date) or isinstance(anchor, datetime):
            raise ArgumentTypeError(f"anchor must be a date, not {type(anchor).__name__}")
        self._setup(_calendar.DailyDays(n, anchor), at, tz, every_n_days=n, anchor=anchor)

    def _identity(self) -> tuple[object, ...]:
        return (self.at, self.every_n_days, self.anchor, self.tz)

    def __repr__(self) -> str:
        extra = f", every_n_days={self.every_n_days}" if self.every_n_days != 1 else ""
        if self.anchor != date(1970, 1, 1):
            extra += f", anchor={self.anchor!r}"
        return f"daily(at={self._at_repr()}{extra}{self._tz_repr()})"


class _DaysTrigger(_CalendarTrigger):
    """Weekly and monthly triggers: listed days at listed times."""

    __slots__ = ("days",)
    days: frozenset[int]
    _name: str

    def __init__(
        self,
        days: object,
        at: TimeOfDay | Iterable[TimeOfDay] = "00:00",
        *,
        tz: str | tzinfo | None = None,
    ) -> None:
        parsed = self._parse_days(days)
        self._setup(self._day_rule(parsed), at, tz, days=parsed)

    @staticmethod
    @abstractmethod
    def _parse_days(days: object) -> frozenset[int]: ...

    @staticmethod
    @abstractmethod
    def _day_rule(days: frozenset[int]) -> DayRule: ...

    def _identity(self) -> tuple[object, ...]:
        return (self.days, self.at, self.tz)

    def __repr__(self) -> str:
        return f"{self._name}(days={sorted(self.days)}, at={self._at_repr()}{self._tz_repr()})"


class WeeklyTrigger(_DaysTrigger):
    """On listed weekdays (Monday = 0) at listed times."""

    __slots__ = ()
    _name = "weekly"
    _parse_days = staticmethod(_calendar.parse_weekdays)
    _day_rule = staticmethod(_calendar.WeeklyDays)


class MonthlyTrigger(_DaysTrigger):
    """On listed days of the month (negative: from the end) at listed times."""

    __slots__ = ()
    _name = "monthly"
    _parse_days = staticmethod(_calendar.parse_month_days)
    _day_rule = staticmethod(_calendar.MonthlyDays)


class IntervalTrigger(_Frozen):
    """Ticks at ``anchor + n * interval`` (n >= 0), with optional jitter, or random gaps.

    The random parts are a pure function of ``(key, tick index)``; a scheduler sets ``key`` to
    the job's name (:meth:`for_job`) so that every replica draws the same numbers.
    """

    __slots__ = ("_rule", "key")
    _rule: IntervalRule
    key: str

    def __init__(self, rule: IntervalRule, key: str = "") -> None:
        self._init(_rule=rule, key=key)

    @property
    def interval(self) -> Any:
        return self._rule.interval

    @property
    def jitter(self) -> Any:
        return self._rule.jitter

    @property
    def between(self) -> Any:
        return self._rule.between

    @property
    def anchor(self) -> datetime:
        return self._rule.anchor

    def for_job(self, name: str) -> Self:
        """A copy whose random parts are keyed by the job name ``name``."""
        return type(self)(self._rule, check_job_name(name))

    def with_default_anchor(self, instant: datetime) -> Self:
        """This trigger, or, if it was built without ``anchor=``, a copy anchored at
        ``instant`` (a job's ``start_at``: its ticks then fall at start_at + n * interval)."""
        if self._rule.anchor_given:
            return self
        rule = dataclasses.replace(self._rule, anchor=require_aware(instant), anchor_given=True)
        return type(self)(rule, self.key)

    def next_after(self, instant: datetime, /) -> datetime | None:
        return self._rule.next_after(require_aware(instant), self.key)

    def _identity(self) -> tuple[object, ...]:
        return (self._rule, self.key)

    def __repr__(self) -> str:
        text = self._rule.describe()
        return f"{text}.for_job({self.key!r})" if self.key else text

    def __str__(self) -> str:
        """For a person, as a config writes it: ``every 5s``, ``every 1m to 5m``."""
        return self._rule.readable()


class FixedDelayTrigger(IntervalTrigger):
    """Each tick is the job's last finish in the ledger plus ``delay``. ``next_after`` gives
    the ticks of ``every(delay)``: a job with no tick recorded yet starts at the first of them
    after its scheduler starts (or ``start_at``), the same on every replica."""

    __slots__ = ()

    @property
    def delay(self) -> timedelta:
        return cast(timedelta, self._rule.interval)  # (a plain delay: never None)

    def __repr__(self) -> str:
        text = "after" + self._rule.describe().removeprefix("every")
        return f"{text}.for_job({self.key!r})" if self.key else text

    def __str__(self) -> str:
        """For a person: ``after 5s`` (each finish)."""
        return "after" + self._rule.readable().removeprefix("every")


class OneTimeTrigger(_Frozen):
    """Fires at each given instant once."""

    __slots__ = ("instants",)
    instants: tuple[datetime, ...]

    def __init__(self, instants: Iterable[datetime], *, now: datetime | None = None) -> None:
        checked = [require_aware(i, "one-time instant").astimezone(UTC) for i in instants]
        if not checked:
            raise PastInstantError("once() needs at least one instant")
        reference = datetime.now(UTC) if now is None else require_aware(now, "now")
        past = [i for i in checked if i < reference]
        if past:
            raise PastInstantError(
                f"one-time instant {past[0].isoformat()} is in the past "
                f"(now is {reference.astimezone(UTC).isoformat()})"
            )
        self._init(instants=tuple(sorted(set(checked))))

    def next_after(self, instant: datetime, /) -> datetime | None:
        i = bisect_right(self.instants, require_aware(instant))
        return self.instants[i] if i < len(self.instants) else None

    def _identity(self) -> tuple[object, ...]:
        return self.instants

    def __repr__(self) -> str:
        return f"once({', '.join(repr(i.isoformat()) for i in self.instants)})"


def cron(expression: str, *, seconds: bool = False, tz: str | tzinfo | None = None) -> CronTrigger:
    """A cron schedule: 5 fields, or 6 with a leading seconds field when ``seconds=True``."""
    return CronTrigger(expression, seconds=seconds, tz=tz)


def every(
    interval: timedelta | None = None,
    /,
    *,
    seconds: float = 0,
    minutes: float = 0,
    hours: float = 0,
    days: float = 0,
    jitter: timedelta | float | None = None,
    anchor: datetime | None = None,
    between: tuple[timedelta | float, timedelta | float] | None = None,
    from_completion: bool = False,
) -> IntervalTrigger:
    """Ticks every ``interval`` (a timedelta, or seconds=/minutes=/hours=/days=), anchored at
    ``anchor`` (default: the Unix epoch), so that every replica agrees on them.

    ``jitter=`` delays each tick by a repeatable random amount below it. ``between=(lo, hi)``
    instead makes each gap a repeatable random duration in ``[lo, hi]``.
    ``from_completion=True`` is a fixed delay, the same as :func:`after`: each tick follows
    the last run's finish by ``interval``, across every replica.
    """
    if from_completion and (jitter is not None or between is not None):
        raise InvalidIntervalError("from_completion=True (a fixed delay) takes no jitter=/between=")
    rule = make_interval_rule(
        interval,
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        days=days,
        jitter=jitter,
        anchor=None if anchor is None else require_aware(anchor, "anchor"),
        between=between,
    )
    return FixedDelayTrigger(rule) if from_completion else IntervalTrigger(rule)


def after(
    delay: timedelta | None = None,
    /,
    *,
    seconds: float = 0,
    minutes: float = 0,
    hours: float = 0,
    days: float = 0,
) -> FixedDelayTrigger:
    """Fixed delay: each run starts ``delay`` after the job's last run finished, as the
    ledger records it, on whichever replica claims it (see :class:`FixedDelayTrigger`)."""
    units = {"seconds": seconds, "minutes": minutes, "hours": hours, "days": days}
    rule = make_interval_rule(delay, **units, jitter=None, anchor=None, between=None)
    return FixedDelayTrigger(rule)


def daily(
    at: TimeOfDay | Iterable[TimeOfDay] = "00:00",
    *,
    every_n_days: int = 1,
    anchor: date = date(1970, 1, 1),
    tz: str | tzinfo | None = None,
) -> DailyTrigger:
    """At the given local time(s) every day, or every ``every_n_days`` days from ``anchor``."""
    return DailyTrigger(at, every_n_days=every_n_days, anchor=anchor, tz=tz)


def weekly(
    days: object, at: TimeOfDay | Iterable[TimeOfDay] = "00:00", *, tz: str | tzinfo | None = None
) -> WeeklyTrigger:
    """On the given weekdays ('mon', 'monday' or 0-6 with Monday = 0) at the given time(s)."""
    return WeeklyTrigger(days, at, tz=tz)


def monthly(
    days: object, at: TimeOfDay | Iterable[TimeOfDay] = "00:00", *, tz: str | tzinfo | None = None
) -> MonthlyTrigger:
    """On the given days of the month (1..31, or -1..-31 from the end) at the given time(s)."""
    return MonthlyTrigger(days, at, tz=tz)


def once(at: datetime, *more: datetime, now: datetime | None = None) -> OneTimeTrigger:
    """At each given instant once. Instants before ``now`` (default: the system clock) are
    rejected; a scheduler passes its own clock's time."""
    return OneTimeTrigger(itertools.chain((at,), more), now=now)
