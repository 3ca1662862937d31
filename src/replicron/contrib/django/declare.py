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

from replicron.errors import InvalidTimezoneError, ReplicronError
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


def _discover_jobs_modules(problems: list[str]) -> None:
    """Import every installed app's ``jobs.py``, as the admin does ``admin.py``, adding a line
    to ``problems`` per module that raised. What a module declared before it raised is
    dropped, so that importing it again declares nothing twice."""
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


def declared_jobs(
    settings: ReplicronSettings, problems: list[str] | None = None
) -> list[Declaration]:
    """The jobs of ``settings["jobs"]``, then those declared with :func:`job` (the apps'
    ``jobs.py`` imported first, unless ``autodiscover`` is off). A bad entry of
    ``settings["jobs"]`` is left out, each of its problems added to ``problems`` (raised
    together as :class:`JobsProblems` when none is given), and so is each ``jobs.py`` that
    raised as it was imported."""
    found: list[Declaration] = []
    wrong: list[str] = []
    if settings.autodiscover:
        _discover_jobs_modules(wrong)
    for at, entry in enumerate(settings.jobs):
        declared = _declaration_of(entry, f"settings.REPLICRON['jobs'][{at}]", wrong)
        if declared is not None:
            found.append(declared)
    if problems is not None:
        problems += wrong
    elif wrong:
        raise JobsProblems(wrong)
    return found + _declared


def _declaration_of(entry: Mapping[str, Any], key: str, problems: list[str]) -> Declaration | None:
    """The job of an entry of ``settings["jobs"]``, or ``None`` with each of its problems
    added to ``problems``."""
    options = dict(entry)
    path, trigger = options.pop("func", None), options.pop("trigger", None)
    func = None
    if not isinstance(path, str):
        problems.append(f"{key}['func']: a dotted path is required, got {path!r}")
    else:
        try:
            func = import_string(path)
        except ImportError as exc:
            problems.append(f"{key}['func']: cannot import {path!r}: {exc}")
    if not isinstance(trigger, Trigger):
        problems.append(
            f"{key}['trigger']: a replicron trigger is required (replicron.cron(...), "
            f"replicron.every(...), ...), got {trigger!r}"
        )
        return None
    if func is None:
        return None
    args = tuple(options.pop("args", ()))
    return Declaration(trigger, func, args, options, f"{key} ({path})")


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
    """A scheduler with the project's backend, options and jobs, not started. Every problem
    of its options and jobs is raised together as ``ImproperlyConfigured``, one line each,
    each naming the job and where it was declared."""
    options: dict[str, Any] = {"timezone": settings.timezone, **settings.scheduler, **overrides}
    backend = make_backend(settings)
    problems: list[str] = []
    try:
        scheduler = Scheduler(backend=backend, **options)
    except (TypeError, ValueError) as exc:
        given_zone = isinstance(exc, InvalidTimezoneError) and "timezone" not in settings.scheduler
        key = "timezone" if given_zone else "scheduler"
        problems.append(f"settings.REPLICRON[{key!r}]: {exc}")
        scheduler = Scheduler(backend=backend)  # for the jobs to be checked all the same
    for declared in declared_jobs(settings, problems):
        options = dict(declared.options)
        try:
            scheduler.add_job(
                declared.trigger,
                with_fresh_connections(declared.func),
                *declared.args,
                **options,
            )
        except (TypeError, ValueError) as exc:
            problems += [
                f"{declared.origin}: {_naming_the_job(declared, line)}"
                for line in str(exc).splitlines()
            ]
    if problems:
        raise JobsProblems(problems)
    return scheduler


def _naming_the_job(declared: Declaration, said: str) -> str:
    """A problem of a job, led by the job's name where it does not say it (a trigger that
    raises as the job is added says only what is wrong with it)."""
    name = declared.options.get("name")
    if not isinstance(name, str) or said.startswith(f"job {name!r}"):
        return said
    return f"job {name!r}: {said}"
