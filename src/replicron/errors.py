"""Every error replicron raises on misuse, rooted at :class:`ReplicronError`.

Bad input is rejected when a trigger or job is defined, never when it first fires. Each
concrete class also subclasses the builtin that fits (``ValueError`` for a bad value,
``TypeError`` for a wrong type), so generic handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "CronSyntaxError",
    "InvalidDayError",
    "InvalidIntervalError",
    "InvalidJobNameError",
    "InvalidTimeOfDayError",
    "InvalidTimezoneError",
    "NaiveDatetimeError",
    "PastInstantError",
    "ReplicronError",
]


class ReplicronError(Exception):
    """Base class of every exception raised by replicron."""


class ConfigurationError(ReplicronError, ValueError):
    """A schedule, job or option was defined with a value that cannot work."""


class CronSyntaxError(ConfigurationError):
    """A cron expression is malformed or can never fire.

    ``field`` names the offending field (``"minute"``, ``"day-of-week"`` ...) or is ``None``
    when the expression as a whole is wrong (field count, unknown descriptor).
    """

    def __init__(self, expression: str, reason: str, field: str | None = None) -> None:
        self.expression = expression
        self.reason = reason
        self.field = field
        where = f" in the {field} field" if field else ""
        super().__init__(f"{reason}{where} of cron expression {expression!r}")


class InvalidTimezoneError(ConfigurationError):
    """A time zone name is unknown or a time zone object is unusable."""


class InvalidIntervalError(ConfigurationError):
    """An interval, jitter or random-interval bound is zero, negative or inconsistent."""


class InvalidTimeOfDayError(ConfigurationError):
    """A time of day (``at=``) is malformed or out of range (hour 24, minute 60 ...)."""


class InvalidDayError(ConfigurationError):
    """A weekday or day of month is out of range or unknown."""


class PastInstantError(ConfigurationError):
    """A one-time schedule names an instant that has already passed."""


class InvalidJobNameError(ConfigurationError):
    """A job name is empty, only whitespace, too long or contains control characters."""


class NaiveDatetimeError(ReplicronError, TypeError):
    """A datetime without a time zone was given where an instant is needed."""
