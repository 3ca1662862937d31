"""Every error replicron raises on misuse, rooted at :class:`ReplicronError`.

Bad input is rejected when a trigger or job is defined, never when it first fires. Each
concrete class also subclasses the builtin that fits (``ValueError`` for a bad value,
``TypeError`` for a wrong type), so generic handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ConfigurationError",
    "CronSyntaxError",
    "DuplicateJobError",
    "ForkedSchedulerError",
    "InvalidDayError",
    "InvalidIntervalError",
    "InvalidJobArgumentsError",
    "InvalidJobNameError",
    "InvalidJobOptionError",
    "InvalidNotifierError",
    "InvalidTimeOfDayError",
    "InvalidTimezoneError",
    "JobNotFoundError",
    "LockKeyCollisionError",
    "NaiveDatetimeError",
    "NoCurrentRunError",
    "PastInstantError",
    "ReplicronError",
    "SchedulerClosedError",
    "StateDirError",
    "UntrustedAdvisoryLocksError",
]


class ReplicronError(Exception):
    """Base class of every exception raised by replicron."""


class ConfigurationError(ReplicronError, ValueError):
    """A schedule, job or option was defined with a value that cannot work."""


class LockKeyCollisionError(ConfigurationError):
    """Two job names of one backend hash to the same lock key; rename one of them."""


class CronSyntaxError(ConfigurationError):
    """A cron expression is malformed or can never fire.

    ``field`` names the offending field (``"minute"``, ``"day-of-week"`` ...) or is ``None``
    when the expression as a whole is wrong (field count, unknown descriptor).
    """

    def __init__(self, expression: str, reason: str, field: str | None = None) -> None:
        self.expression = expression
        self.reason = reason
        self.field = field
        if field:
            message = f"{reason} in the {field} field of cron expression {expression!r}"
        else:
            message = f"{reason} (cron expression {expression!r})"
        super().__init__(message)


class StateDirError(ConfigurationError):
    """The embedded backend's state directory or ledger cannot be used: not a directory, not
    writable, not a SQLite database, written by a newer replicron, no working file locks.

    ``path`` is the file or directory at fault, ``problem`` what is wrong with it.
    """

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(problem.split())  # one line, whatever the OS said
        super().__init__(f"replicron state {self.path}: {self.problem}")


class UntrustedAdvisoryLocksError(ConfigurationError):
    """The PostgreSQL-compatible server's session advisory locks do not behave as PostgreSQL's
    (CockroachDB's always succeed, YugabyteDB's are disabled or silenced), so the backend's
    default coordination through them cannot work there: use lease mode,
    ``PostgresBackend(..., coordination="lease")``.

    ``server`` names the server when its version string does (``"CockroachDB"``,
    ``"YugabyteDB"``, else the start of the version string, or ``None``); ``observed`` says
    what the locks did; ``lease_setting``, how the user sets lease mode where they configure
    replicron.
    """

    def __init__(
        self,
        observed: str,
        server: str | None = None,
        *,
        lease_setting: str = 'PostgresBackend(..., coordination="lease")',
    ) -> None:
        self.observed = observed
        self.server = server
        where = f"on {server}" if server else "on this server"
        super().__init__(
            f"session advisory locks cannot be trusted {where}: {observed}. The default "
            'coordination ("advisory") relies on them; use lease mode instead: '
            f"{lease_setting}."
        )


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


class InvalidJobOptionError(ConfigurationError):
    """A job or scheduler option has a value it cannot take (overlap policy, timeout ...)."""


class InvalidNotifierError(ConfigurationError):
    """A notifier setting cannot work: a URL that is not http(s), an unknown event name, a
    bad number. The message names the field (and the job, for a job's ping URL), never a
    URL's secret parts."""


class InvalidJobArgumentsError(ReplicronError, TypeError):
    """The arguments given for a job's function do not fit its signature."""


class DuplicateJobError(ConfigurationError):
    """A job with this name is already registered in the scheduler."""


class JobNotFoundError(ReplicronError, LookupError):
    """No job with this name (or tag) is registered."""


class SchedulerClosedError(ReplicronError, RuntimeError):
    """The scheduler was shut down; it takes no more jobs and runs nothing."""


class ForkedSchedulerError(ReplicronError, RuntimeError):
    """A scheduler started in one process was used in a process forked from it.

    Its threads and event loop did not survive the fork. Start schedulers after forking
    (for gunicorn: in ``post_fork`` or without ``--preload``).
    """


class NoCurrentRunError(ReplicronError, LookupError):
    """:func:`replicron.current_run` was called outside a job's run."""


class ArgumentTypeError(ReplicronError, TypeError):
    """A value of the wrong type was passed (a number for a cron string, a str for an instant)."""
