"""From a checked config to what the library runs: triggers, tasks and job options. Importing
a ``call`` target and looking a command's program up happen here, so that ``replicron check``
and the daemon find the same problems before anything runs."""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from replicron.errors import PastInstantError, ReplicronError
from replicron.scheduler import AsyncScheduler
from replicron.triggers import Trigger, after, cron, daily, every, monthly, once, weekly

from ._values import ValueProblem, parse_duration, parse_instant
from .command import CommandTask
from .config import DaemonConfig, JobConfig

__all__ = [
    "JobProblem",
    "Task",
    "add_job",
    "add_jobs",
    "make_task",
    "make_trigger",
    "options_of",
    "update_job",
]

#: What a job runs: the callable and its bound arguments.
Task = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def make_trigger(job: JobConfig) -> Trigger:
    value = job.schedule
    if job.trigger == "cron":
        if not isinstance(value, str):
            raise ValueProblem(f"must be a cron expression string, not {value!r}")
        return cron(value, seconds=job.seconds, tz=job.tz)
    if job.trigger == "every":
        return every(parse_duration(value), jitter=job.jitter)
    if job.trigger == "after":  # fixed delay: from the last finish in the ledger
        return after(parse_duration(value))
    if job.trigger == "between":
        if not isinstance(value, list) or len(value) != 2:
            raise ValueProblem(f'must be two durations, such as ["1m", "5m"], not {value!r}')
        return every(between=(parse_duration(value[0]), parse_duration(value[1])))
    if job.trigger == "daily":
        return daily(_times(value), tz=job.tz)
    if job.trigger == "weekly":
        return weekly(value, job.at, tz=job.tz)
    if job.trigger == "monthly":
        return monthly(value, job.at, tz=job.tz)
    instants = [parse_instant(v) for v in (value if isinstance(value, list) else [value])]
    if not instants:
        raise ValueProblem("needs at least one date-time")
    # A one-time tick in the past is no error for a daemon that restarts after it ran: the
    # ledger has its row, and the misfire rules decide about one that nobody ran.
    return once(*instants, now=_EPOCH)


def _times(value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise ValueProblem(
            f'must be a time of day such as "03:00", or a list of them, not {value!r}'
        )
    return items


def options_of(job: JobConfig) -> dict[str, Any]:
    return {
        "name": job.name,
        "tags": job.tags,
        "overlap": job.overlap,
        "timeout": job.timeout,
        "start_at": job.start_at,
        "stop_at": job.stop_at,
        "max_runs": job.max_runs,
        "catch_up": job.catch_up,
        "misfire_grace": job.misfire_grace,
        "leader": job.leader,
    }


def make_task(job: JobConfig, config_dir: str) -> Task:
    if job.command is not None:
        _check_program(job)
        cwd = _cwd(job)
        task = CommandTask(
            job.name,
            job.command,
            shell=job.shell,
            env=dict(job.env),
            cwd=cwd,
            kill_grace=job.kill_grace,
        )
        return task, (), {}
    assert job.call is not None
    return _import(job.call, config_dir), job.args, dict(job.kwargs)


def _cwd(job: JobConfig) -> str | None:
    if job.cwd is None:
        return None
    if not os.path.isdir(job.cwd):  # relative to where the daemon starts, like state_dir
        raise ValueProblem(f"cwd: {job.cwd!r} is not a directory")
    return os.path.abspath(job.cwd)


def _check_program(job: JobConfig) -> None:
    assert job.command is not None
    program = "/bin/sh" if job.shell else job.command[0]
    cwd = _cwd(job) or os.getcwd()
    if os.sep in program:
        path = os.path.join(cwd, program)
        if not os.path.isfile(path):
            raise ValueProblem(f"command: {program!r} does not exist (looked in {cwd!r})")
        if not os.access(path, os.X_OK):
            raise ValueProblem(f"command: {program!r} is not executable")
        return
    search = dict(job.env).get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=search) is None:
        raise ValueProblem(f"command: {program!r} is not found on PATH ({search})")


def _import(target: str, config_dir: str) -> Callable[..., Any]:
    module_name, _, attribute = target.partition(":")
    for where in (os.getcwd(), config_dir):
        if where not in sys.path:
            sys.path.insert(0, where)
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueProblem(f"call: cannot import {module_name!r}: {exc}") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed (or exited) on import
        said = " ".join(str(exc).split())
        raise ValueProblem(
            f"call: importing {module_name!r} raised {type(exc).__name__}: {said}"
        ) from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueProblem(f"call: module {module_name!r} has no {attribute!r}") from None
    if not callable(found):
        raise ValueProblem(f"call: {target!r} is not callable ({type(found).__name__})")
    return found  # type: ignore[no-any-return]


#: The fields a job's trigger and its task are made of, besides the trigger's own key.
_TRIGGER_FIELDS = frozenset({"seconds", "at", "tz", "jitter"})
_TASK_FIELDS = frozenset({"command", "call", "args", "kwargs", "env", "cwd", "shell", "kill_grace"})


def add_jobs(
    scheduler: AsyncScheduler,
    config: DaemonConfig,
    broken_fields: Mapping[str, frozenset[str]] | None = None,
) -> list[str]:
    """Add every job of ``config`` to ``scheduler``; returns one line per problem of the jobs
    that could not be added (the rest are added). A job named in ``broken_fields`` (fields
    that had a problem when read) is only checked: its trigger and its task, each unless
    it is made of a broken field."""
    problems = []
    config_dir = os.path.dirname(os.path.abspath(config.path))
    for job in config.jobs:
        broken = (broken_fields or {}).get(job.name)
        try:
            if broken is None:
                add_job(scheduler, job, config_dir)
            else:
                trigger, task = not broken & _TRIGGER_FIELDS, not broken & _TASK_FIELDS
                _checked_parts(job, config_dir, trigger=trigger, task=task)
        except JobProblem as exc:
            problems += [f"{config.path}: job {job.name!r}: {line}" for line in exc.lines]
    return problems


class JobProblem(ValueError):
    """Why a job cannot be added: ``lines``, one per problem, each following "job 'name': "."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def add_job(scheduler: AsyncScheduler, job: JobConfig, config_dir: str) -> None:
    """Add ``job``; a one-time job whose instants have all passed is left out, no error
    (see :func:`make_trigger`): it has nothing left to run."""
    trigger, (func, args, kwargs) = _parts(job, config_dir)
    try:
        scheduler.add_job(trigger, func, *args, **options_of(job), **kwargs)
    except PastInstantError as exc:
        if job.trigger != "once":
            raise JobProblem(_unprefixed(exc, job.name)) from None
    except (ReplicronError, TypeError) as exc:
        raise JobProblem(_unprefixed(exc, job.name)) from None


def update_job(scheduler: AsyncScheduler, job: JobConfig, config_dir: str) -> None:
    """Change ``job`` in place, keeping its run-time state: a run of it going on still guards
    against overlap with the changed job's next run."""
    trigger, (func, args, kwargs) = _parts(job, config_dir)
    options = options_of(job)
    del options["name"]
    scheduler.get_job(job.name).update(trigger, func=func, args=args, kwargs=kwargs, **options)


def _parts(job: JobConfig, config_dir: str) -> tuple[Trigger, Task]:
    """The job's trigger and task, or a :class:`JobProblem` saying what is wrong with
    either, or with both."""
    trigger, task = _checked_parts(job, config_dir, trigger=True, task=True)
    assert trigger is not None
    assert task is not None
    return trigger, task


def _checked_parts(
    job: JobConfig, config_dir: str, *, trigger: bool, task: bool
) -> tuple[Trigger | None, Task | None]:
    """:func:`_parts`, with only the parts asked for (the others ``None``)."""
    made, problems = _trigger(job) if trigger else (None, [])
    try:
        work = make_task(job, config_dir) if task else None
    except (ValueProblem, ReplicronError) as exc:
        problems += _unprefixed(exc, job.name)
    if problems:
        raise JobProblem(problems)
    return made, work


def _trigger(job: JobConfig) -> tuple[Trigger | None, list[str]]:
    """The job's trigger, or the problems of its ``tz`` and of its trigger's value, each
    found whatever the other's."""
    problems = []
    if job.tz is not None:
        try:
            daily("00:00", tz=job.tz)
        except ReplicronError as exc:
            problems += [f"tz: {line}" for line in _unprefixed(exc, job.name)]
            job = dataclasses.replace(job, tz=None)
    try:
        trigger = make_trigger(job)
    except (ValueProblem, ReplicronError) as exc:
        problems += [f"{job.trigger}: {line}" for line in _unprefixed(exc, job.name)]
    return (None, problems) if problems else (trigger, [])


def _unprefixed(exc: Exception, name: str) -> list[str]:
    """The library's problems (one a line) without their "job 'name': " (the daemon's line
    has one)."""
    prefix = f"job {name!r}: "
    return [line.removeprefix(prefix) for line in str(exc).splitlines()]
