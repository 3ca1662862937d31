"""replicron: scheduled jobs inside Python services, each tick run exactly once across replicas."""

from __future__ import annotations

from .clock import Clock, SystemClock
from .errors import (
    ConfigurationError,
    CronSyntaxError,
    InvalidDayError,
    InvalidIntervalError,
    InvalidJobNameError,
    InvalidTimeOfDayError,
    InvalidTimezoneError,
    NaiveDatetimeError,
    PastInstantError,
    ReplicronError,
)
from .keys import check_job_name, job_lock_key
from .triggers import (
    CronTrigger,
    DailyTrigger,
    IntervalTrigger,
    MonthlyTrigger,
    OneTimeTrigger,
    Trigger,
    WallClockTrigger,
    WeeklyTrigger,
    cron,
    daily,
    every,
    monthly,
    once,
    upcoming,
    weekly,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "Clock",
    "ConfigurationError",
    "CronSyntaxError",
    "CronTrigger",
    "DailyTrigger",
    "IntervalTrigger",
    "InvalidDayError",
    "InvalidIntervalError",
    "InvalidJobNameError",
    "InvalidTimeOfDayError",
    "InvalidTimezoneError",
    "MonthlyTrigger",
    "NaiveDatetimeError",
    "OneTimeTrigger",
    "PastInstantError",
    "ReplicronError",
    "SystemClock",
    "Trigger",
    "WallClockTrigger",
    "WeeklyTrigger",
    "__version__",
    "check_job_name",
    "cron",
    "daily",
    "every",
    "job_lock_key",
    "monthly",
    "once",
    "upcoming",
    "weekly",
]
