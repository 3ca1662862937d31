"""The ``REPLICRON`` setting of a Django project, read and checked once: every problem names
the key to fix, as ``ImproperlyConfigured`` (Django's) at startup and in ``manage.py check``.

The backend comes from a ``DATABASES`` alias by default, so that there is no second database
URL to keep in step: the PostgreSQL backend connects with that alias's NAME, USER, PASSWORD,
HOST, PORT and OPTIONS (its own lock session or lease connection, never Django's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from replicron.backends.base import Backend
from replicron.backends.embedded import EmbeddedBackend
from replicron.backends.memory import MemoryBackend
from replicron.errors import ConfigurationError
from replicron.keys import check_namespace

__all__ = ["ReplicronSettings", "conninfo_of_alias", "make_backend", "read_settings"]

BackendKind = Literal["postgres", "embedded", "memory"]

_KEYS = {
    "backend",
    "database",
    "state_dir",
    "namespace",
    "coordination",
    "timezone",
    "jobs",
    "scheduler",
    "backend_options",
    "run_in_web_process",
    "autodiscover",
}
#: OPTIONS of Django's PostgreSQL backend that are Django's own, not libpq's.
_DJANGO_OPTIONS = {
    "assume_role",
    "isolation_level",
    "pool",
    "server_side_binding",
    "prepare_threshold",
    "cursor_factory",
    "context",
}
_POSTGRES_VENDOR = "postgresql"


@dataclass(frozen=True)
class ReplicronSettings:
    backend: BackendKind = "postgres"
    #: The ``DATABASES`` alias the PostgreSQL backend connects as.
    database: str = "default"
    state_dir: Path | None = None
    namespace: str = ""
    coordination: Literal["advisory", "lease"] = "advisory"
    #: The scheduler's default time zone: Django's TIME_ZONE where settings.py sets it,
    #: else UTC (never Django's built-in default, America/Chicago).
    timezone: str = "UTC"
    #: Jobs declared here: mappings with ``func`` (a dotted path), ``trigger`` and
    #: ``add_job``'s options.
    jobs: tuple[Mapping[str, Any], ...] = ()
    #: More keyword arguments of ``Scheduler`` (max_workers, stop_timeout, ...).
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    #: More keyword arguments of the backend (heartbeat_interval, retention, ...).
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    #: Start the scheduler in the web server's process (see docs/django.md).
    run_in_web_process: bool = False
    #: Import ``jobs.py`` of every installed app (as the admin does with ``admin.py``).
    autodiscover: bool = True


def _problem(key: str, text: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"settings.REPLICRON[{key!r}]: {text}")


def read_settings() -> ReplicronSettings:
    """``settings.REPLICRON`` checked into plain values (a missing setting is all defaults)."""
    raw = django_settings.REPLICRON if django_settings.is_overridden("REPLICRON") else {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"settings.REPLICRON must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise _problem(unknown[0], f"unknown key (known: {', '.join(sorted(_KEYS))})")
    backend = raw.get("backend", "postgres")
    if backend not in ("postgres", "embedded", "memory"):
        raise _problem("backend", f"must be 'postgres', 'embedded' or 'memory', not {backend!r}")
    state_dir = raw.get("state_dir")
    if backend == "embedded" and not state_dir:
        raise _problem("state_dir", "is required with 'backend': 'embedded' (a directory)")
    coordination = raw.get("coordination", "advisory")
    if coordination not in ("advisory", "lease"):
        raise _problem("coordination", f"must be 'advisory' or 'lease', not {coordination!r}")
    for key in ("namespace", "database"):
        if not isinstance(raw.get(key, ""), str):
            raise _problem(key, f"must be a string, not {raw[key]!r}")
    try:
        check_namespace(raw.get("namespace", ""))
    except ConfigurationError as exc:
        raise _problem("namespace", str(exc).removeprefix("namespace ")) from None
    jobs = raw.get("jobs", ())
    if not isinstance(jobs, list | tuple) or not all(isinstance(j, Mapping) for j in jobs):
        raise _problem("jobs", "must be a list of dicts (func, trigger and add_job's options)")
    for key in ("scheduler", "backend_options"):
        if not isinstance(raw.get(key, {}), Mapping):
            raise _problem(key, f"must be a dict of keyword arguments, not {raw[key]!r}")
    for key in ("run_in_web_process", "autodiscover"):
        if not isinstance(raw.get(key, False), bool):
            raise _problem(key, f"must be True or False, not {raw[key]!r}")
    timezone = raw.get("timezone", _django_zone())
    if not isinstance(timezone, str):
        raise _problem("timezone", f"must be an IANA zone name, not {timezone!r}")
    found = ReplicronSettings(
        backend=backend,
        database=raw.get("database", "default"),
        state_dir=Path(state_dir) if state_dir else None,
        namespace=raw.get("namespace", ""),
        coordination=coordination,
        timezone=timezone,
        jobs=tuple(jobs),
        scheduler=dict(raw.get("scheduler", {})),
        backend_options=dict(raw.get("backend_options", {})),
        run_in_web_process=raw.get("run_in_web_process", False),
        autodiscover=raw.get("autodiscover", True),
    )
    if backend == "postgres":
        conninfo_of_alias(found.database)  # the alias is there, and PostgreSQL
    return found


def _django_zone() -> str:
    if django_settings.is_overridden("TIME_ZONE") and django_settings.TIME_ZONE:
        return str(django_settings.TIME_ZONE)
    return "UTC"


def conninfo_of_alias(alias: str) -> str:
    """A libpq connection string for the ``DATABASES`` alias (its password included: never
    log it; replicron masks it in its own messages)."""
    if alias not in django_settings.DATABASES:
        raise _problem("database", f"{alias!r} is not in settings.DATABASES")
    connection = connections[alias]
    if connection.vendor != _POSTGRES_VENDOR:
        raise _problem(
            "database",
            f"DATABASES[{alias!r}] is {connection.vendor}, not PostgreSQL: replicron "
            "coordinates replicas through PostgreSQL; for one host set 'backend': 'embedded' "
            "with a 'state_dir'",
        )
    from psycopg.conninfo import make_conninfo

    given = connection.settings_dict
    params: dict[str, Any] = {
        key: value
        for key, value in (given.get("OPTIONS") or {}).items()
        if key not in _DJANGO_OPTIONS
    }
    for key, name in (
        ("NAME", "dbname"),
        ("USER", "user"),
        ("PASSWORD", "password"),
        ("HOST", "host"),
        ("PORT", "port"),
    ):
        if given.get(key):
            params[name] = str(given[key])
    return make_conninfo("", **params)


def make_backend(settings: ReplicronSettings, *, migrate: bool = True) -> Backend:
    """The backend the settings name, not opened. ``migrate``: the PostgreSQL backend applies
    replicron's migrations as it opens (``manage.py migrate`` does too)."""
    options = dict(settings.backend_options)
    try:
        if settings.backend == "memory":
            return MemoryBackend(**options)
        if settings.backend == "embedded":
            assert settings.state_dir is not None
            return EmbeddedBackend(settings.state_dir, **options)
        from replicron.postgres import PostgresBackend, SettingNames

        names = SettingNames(
            lease="settings.REPLICRON['coordination'] = 'lease'",
            session_pooler="'session_pooler': True in settings.REPLICRON['backend_options']",
        )

        options.setdefault("migrate", migrate)
        return PostgresBackend(
            conninfo_of_alias(settings.database),
            namespace=settings.namespace,
            coordination=settings.coordination,
            setting_names=names,
            **options,
        )
    except (TypeError, ValueError) as exc:
        raise _problem("backend_options", str(exc)) from exc
