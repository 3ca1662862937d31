"""replicron: scheduled jobs inside Python services, each tick run exactly once across replicas."""

from __future__ import annotations

from .backends import Backend, MemoryBackend, MemoryState
from .clock import Clock, SystemClock
from .context import RunContext, current_run
from .errors import (
    ArgumentTypeError,
    ConfigurationError,
    CronSyntaxError,
    DuplicateJobError,
    ForkedSchedulerError,
    InvalidDayError,
    InvalidIntervalError,
    InvalidJobArgumentsError,
    InvalidJobNameError,
    InvalidJobOptionError,
    InvalidTimeOfDayError,
    InvalidTimezoneError,
    JobNotFoundError,
    NaiveDatetimeError,
    NoCurrentRunError,
    PastInstantError,
    ReplicronError,
    SchedulerClosedError,
)
from .events import Listener, Outcome, RunEvent
from .jobs import Job
from .keys import check_job_name, job_lock_key
from .scheduler import AsyncScheduler, Scheduler
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
    "ArgumentTypeError",
    "AsyncScheduler",
    "Backend",
    "Clock",
    "ConfigurationError",
    "CronSyntaxError",
    "CronTrigger",
    "DailyTrigger",
    "DuplicateJobError",
    "ForkedSchedulerError",
    "IntervalTrigger",
    "InvalidDayError",
    "InvalidIntervalError",
    "InvalidJobArgumentsError",
    "InvalidJobNameError",
    "InvalidJobOptionError",
    "InvalidTimeOfDayError",
    "InvalidTimezoneError",
    "Job",
    "JobNotFoundError",
    "Listener",
    "MemoryBackend",
    "MemoryState",
    "MonthlyTrigger",
    "NaiveDatetimeError",
    "NoCurrentRunError",
    "OneTimeTrigger",
    "Outcome",
    "PastInstantError",
    "ReplicronError",
    "RunContext",
    "RunEvent",
    "Scheduler",
    "SchedulerClosedError",
    "SystemClock",
    "Trigger",
    "WallClockTrigger",
    "WeeklyTrigger",
    "__version__",
    "check_job_name",
    "cron",
    "current_run",
    "daily",
    "every",
    "job_lock_key",
    "monthly",
    "once",
    "upcoming",
    "weekly",
]
