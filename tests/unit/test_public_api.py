"""Pins the public API: a change here is a change users see."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import replicron

#: The public errors (``replicron.errors``).
ERRORS = [
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

EXPECTED = {
    "replicron": [
        *ERRORS,  # every error is also exported by the package itself
        "AsyncScheduler",
        "Backend",
        "CancelReason",
        "Clock",
        "CronTrigger",
        "DailyTrigger",
        "EmbeddedBackend",
        "FixedDelayTrigger",
        "IntervalTrigger",
        "Job",
        "Listener",
        "MemoryBackend",
        "MemoryState",
        "MonthlyTrigger",
        "OneTimeTrigger",
        "Outcome",
        "RunContext",
        "RunEvent",
        "Scheduler",
        "SystemClock",
        "Trigger",
        "WallClockTrigger",
        "WeeklyTrigger",
        "__version__",
        "after",
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
    ],
    "replicron.testing": ["FakeClock"],
    "replicron.errors": ERRORS,
    "replicron.backends": [
        "Backend",
        "Claim",
        "ClaimRequest",
        "ClaimStatus",
        "EmbeddedBackend",
        "MemoryBackend",
        "MemoryState",
        "Release",
        "RunRecord",
        "RunRequests",
    ],
    "replicron.backends.embedded": ["EmbeddedBackend", "LEDGER_NAME", "LOCKS_DIR"],
    "replicron.backends.leadership": ["Leader", "LeaderLease", "LeaderTerm"],
    "replicron.events": ["Listener", "Outcome", "RunEvent"],
    "replicron.context": ["CancelReason", "RunContext", "current_run"],
    "replicron.clock": ["Clock", "ClusterClock", "SystemClock"],
    "replicron.keys": ["MAX_JOB_NAME_LENGTH", "LockKeyRegistry", "check_job_name", "job_lock_key"],
    "replicron.cli": ["main", "run_cluster_command"],
    "replicron.cluster": [
        "DEFAULT_OVERDUE_GRACE",
        "MOST_EXPECTED",
        "ClusterStatus",
        "JobDefinition",
        "JobState",
        "JobStatus",
        "JobView",
        "Pause",
        "Problem",
        "ProblemKind",
        "Registration",
        "ReplicaStatus",
        "Severity",
        "StatusSource",
        "build_status",
    ],
    "replicron.web": ["status_app"],
    "replicron.dsn": ["mask_dsn", "mask_secrets", "plain_postgres_url"],
    "replicron.backends.sqlfiles": ["Migration", "SqlFiles"],
    "replicron.notify": [
        "DEFAULT_EVENTS",
        "EVENTS",
        "FIELDS",
        "NotificationCounts",
        "Notifier",
        "check_url",
        "mask_url",
    ],
    "replicron.metrics": [
        "DURATION_BUCKETS",
        "LATENESS_BUCKETS",
        "NotifierCollector",
        "ReplicronCollector",
    ],
    "replicron.postgres": [
        "BackendUnavailableError",
        "ConnectionSource",
        "CoordinationMode",
        "JobStatus",
        "LockKeyCollisionError",
        "LockedRun",
        "MixedModesError",
        "PostgresBackend",
        "ReplicaStatus",
        "SettingNames",
        "TransactionPoolerError",
        "UntrustedAdvisoryLocksError",
        "alocked_run",
        "conninfo_of",
        "locked_run",
        "migrate",
    ],
    "replicron.daemon": [
        "CommandFailed",
        "CommandTask",
        "ConfigError",
        "DaemonConfig",
        "JobConfig",
        "SchedulerConfig",
        "check_config",
        "load_config",
        "run_daemon",
    ],
}


#: The Django app, checked in a configured project by tests/django/test_layout.py: Django
#: stays out of this process (its lazy settings object fails any look at it unconfigured).
DJANGO_APP = "replicron.contrib.django"


def _all_modules() -> list[str]:
    """Every module of the package (``__main__`` entry points and the Django app aside),
    found by its files: importing the app's package to walk it would import Django."""
    root = Path(replicron.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        parts = ("replicron", *path.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        in_app = name == DJANGO_APP or name.startswith(DJANGO_APP + ".")
        if parts[-1] != "__main__" and not in_app:
            found.append(name)
    return sorted(found)


MODULES = _all_modules()


@pytest.mark.parametrize(("module", "names"), EXPECTED.items())
def test_public_names(module: str, names: list[str]) -> None:
    assert sorted(importlib.import_module(module).__all__) == sorted(names)


@pytest.mark.parametrize("module", MODULES)
def test_every_module_declares_all_and_exports_exist(module: str) -> None:
    mod = importlib.import_module(module)
    assert isinstance(mod.__all__, list)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_every_error_is_a_replicron_error_and_a_builtin() -> None:
    from replicron import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, replicron.ReplicronError)
        if cls is not replicron.ReplicronError:
            assert issubclass(cls, ValueError | TypeError | LookupError | RuntimeError), name


def test_core_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    heavy = "{'psycopg', 'prometheus_client', 'asyncpg', 'django'}"
    code = (
        "import replicron, sys; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
