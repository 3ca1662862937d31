"""Jobs of a Django project: declared with :func:`job` in an app's ``jobs.py`` (found like
``admin.py``) or listed in ``settings.REPLICRON["jobs"]``, and added to a scheduler by
:func:`build_scheduler`. A ``jobs.py`` that raises while it is imported (a trigger is built
before :func:`job` learns the job's name) is :class:`JobsProblems` naming the module and the
line of the project's code that raised, never a traceback through replicron.

A sync task runs between two ``close_old_connections()``, as a request does: a worker
thread's database connection that went stale (``CONN_MAX_AGE``, or a server that closed it)
is not reused, and one opened by the task is closed when its age is up.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sysconfig
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from django.utils.module_loading import import_string, module_has_submodule

from replicron.errors import ReplicronError
from replicron.scheduler import Scheduler
from replicron.triggers import Trigger

from .conf import ReplicronSettings, make_backend

__all__ = ["Declaration", "JobsProblems", "build_scheduler", "declared_jobs", "job"]

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


class JobsProblems(ImproperlyConfigured):
    """Problems of the project's jobs, one line each (``problems``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


def _discover_jobs_modules() -> None:
    """Import every installed app's ``jobs.py``, as the admin does ``admin.py``; raises
    :class:`JobsProblems` with a line per module that raised. What a module declared before
    it raised is dropped, so that importing it again declares nothing twice."""
    problems = []
    for app_config in apps.get_app_configs():
        module = f"{app_config.name}.jobs"
        declared = len(_declared)
        try:
            importlib.import_module(module)
        except Exception as exc:
            del _declared[declared:]
            if module_has_submodule(app_config.module, "jobs"):
                problems.append(
                    f"cannot import {module}: {_where_it_raised(exc, module)}{_said(exc)}"
                )
    if problems:
        raise JobsProblems(problems)


def _said(exc: Exception) -> str:
    # replicron's errors say what is wrong on their own; another error needs its kind.
    return str(exc) if isinstance(exc, ReplicronError) else f"{type(exc).__name__}: {exc}"


#: Where code that is not the project's lives: replicron, the standard library, packages.
_NOT_THE_PROJECTS = tuple(
    os.path.join(path, "")
    for path in {str(Path(__file__).parents[2])}
    | {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def _where_it_raised(exc: Exception, module: str) -> str:
    """``file:line: `` of the project's code that raised ``exc`` while ``module`` was
    imported: the innermost frame outside replicron, the standard library and installed
    packages (else the module's own innermost frame)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: "
    frames = list(traceback.walk_tb(exc.__traceback__))
    for frame, line in reversed(frames):
        path = frame.f_code.co_filename
        if not path.startswith(("<", *_NOT_THE_PROJECTS)):
            return f"{path}:{line}: "
    for frame, line in reversed(frames):
        if frame.f_globals.get("__name__") == module:
            return f"{frame.f_code.co_filename}:{line}: "
    return ""


def declared_jobs(settings: ReplicronSettings) -> list[Declaration]:
    """The jobs of ``settings["jobs"]``, then those declared with :func:`job` (the apps'
    ``jobs.py`` imported first, unless ``autodiscover`` is off)."""
    if settings.autodiscover:
        _discover_jobs_modules()
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
            raise ImproperlyConfigured(
                f"{declared.origin}: {_naming_the_job(declared, exc)}"
            ) from exc
    return scheduler


def _naming_the_job(declared: Declaration, exc: Exception) -> str:
    """``exc``'s message, led by the job's name where it does not say it (a trigger that
    raises as the job is added says only what is wrong with it)."""
    name = declared.options.get("name")
    said = str(exc)
    if not isinstance(name, str) or said.startswith(f"job {name!r}"):
        return said
    return f"job {name!r}: {said}"
