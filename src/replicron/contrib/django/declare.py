"""Jobs of a Django project: declared with :func:`job` in an app's ``jobs.py`` (found like
``admin.py``) or listed in ``settings.REPLICRON["jobs"]``, and added to a scheduler by
:func:`build_scheduler`.

A sync task runs between two ``close_old_connections()``, as a request does: a worker
thread's database connection that went stale (``CONN_MAX_AGE``, or a server that closed it)
is not reused, and one opened by the task is closed when its age is up.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from django.utils.module_loading import autodiscover_modules, import_string

from replicron.scheduler import Scheduler
from replicron.triggers import Trigger

from .conf import ReplicronSettings, make_backend

__all__ = ["Declaration", "build_scheduler", "declared_jobs", "job"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Declaration:
    trigger: Trigger
    func: Callable[..., Any]
    args: tuple[Any, ...]
    options: Mapping[str, Any]
    #: Where it was declared, for error messages.
    origin: str


_declared: list[Declaration] = []


def job(trigger: Trigger, /, *args: Any, **options: Any) -> Callable[[F], F]:
    """Declare ``func(*args, **kwargs)`` a job of the project, with :meth:`Scheduler.add_job`'s
    options (``name``, ``timeout``, ``overlap``, ...); returns the function unchanged. Checked
    when a scheduler is built (``manage.py replicron check`` builds one)."""

    def declare(func: F) -> F:
        where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
        _declared.append(Declaration(trigger, func, args, dict(options), where))
        return func

    return declare


def declared_jobs(settings: ReplicronSettings) -> list[Declaration]:
    """The jobs of ``settings["jobs"]``, then those declared with :func:`job` (the apps'
    ``jobs.py`` imported first, unless ``autodiscover`` is off)."""
    if settings.autodiscover:
        autodiscover_modules("jobs")
    found = []
    for at, entry in enumerate(settings.jobs):
        key = f"settings.REPLICRON['jobs'][{at}]"
        options = dict(entry)
        path, trigger = options.pop("func", None), options.pop("trigger", None)
        if not isinstance(path, str):
            raise ImproperlyConfigured(f"{key}['func']: a dotted path is required, got {path!r}")
        if not isinstance(trigger, Trigger):
            raise ImproperlyConfigured(
                f"{key}['trigger']: a replicron trigger is required (replicron.cron(...), "
                f"replicron.every(...), ...), got {trigger!r}"
            )
        try:
            func = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{key}['func']: cannot import {path!r}: {exc}") from exc
        args = tuple(options.pop("args", ()))
        found.append(Declaration(trigger, func, args, options, f"{key} ({path})"))
    return found + _declared


def with_fresh_connections(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` between two ``close_old_connections()``; async functions as they are (they
    reach the ORM through ``sync_to_async``, which does the same)."""
    if inspect.iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return run


def build_scheduler(settings: ReplicronSettings, **overrides: Any) -> Scheduler:
    """A scheduler with the project's backend, options and jobs, not started. A job that
    cannot be added raises ``ImproperlyConfigured`` naming it and where it was declared."""
    options: dict[str, Any] = {"timezone": settings.timezone, **settings.scheduler, **overrides}
    backend = make_backend(settings)
    try:
        scheduler = Scheduler(backend=backend, **options)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"settings.REPLICRON['scheduler']: {exc}") from exc
    for declared in declared_jobs(settings):
        options = dict(declared.options)
        try:
            scheduler.add_job(
                declared.trigger, with_fresh_connections(declared.func), *declared.args,
                **options,
            )  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{declared.origin}: {exc}") from exc
    return scheduler
