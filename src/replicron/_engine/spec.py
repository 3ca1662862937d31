"""Job specifications: validated once, at registration, so that nothing fails at first fire."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any, TypeVar

from replicron._schedule.durations import as_duration, duration_text
from replicron.errors import (
    InvalidJobArgumentsError,
    InvalidJobNameError,
    InvalidJobOptionError,
    ReplicronError,
)
from replicron.keys import check_job_name
from replicron.triggers import (
    IntervalTrigger,
    OneTimeTrigger,
    Trigger,
    WallClockTrigger,
    require_aware,
)

from .planner import CatchUp, OverlapPolicy

__all__ = ["JobSpec", "build_job_spec"]

_OVERLAP = ("skip", "queue", "allow")
_NO_TAGS: frozenset[str] = frozenset()
_KNOWN_TRIGGERS = (WallClockTrigger, IntervalTrigger, OneTimeTrigger)
_CATCH_UP = ("latest", "none", "all")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything about a job except its run-time state."""

    name: str
    trigger: Trigger
    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(hash=False)
    is_async: bool
    tags: frozenset[str]
    overlap: OverlapPolicy
    timeout: timedelta | None
    start_at: datetime | None
    stop_at: datetime | None
    max_runs: int | None
    catch_up: CatchUp
    misfire_grace: timedelta | None
    #: Leader mode: only the replica holding the leader lease claims the job's ticks
    #: (``None``: as the scheduler's ``leader`` option says).
    leader: bool | None = None
    #: ``func`` with its arguments bound: one call per run, no argument unpacking.
    call: Callable[[], Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bound = self.func
        if self.args or self.kwargs:
            bound = functools.partial(self.func, *self.args, **self.kwargs)
        object.__setattr__(self, "call", bound)


def build_job_spec(
    trigger: Trigger,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    name: str | None,
    tags: Iterable[str] | str,
    overlap: str,
    timeout: timedelta | float | None,
    start_at: datetime | None,
    stop_at: datetime | None,
    max_runs: int | None,
    catch_up: str,
    misfire_grace: timedelta | float | None,
    default_tz: tzinfo,
    leader: bool | None = None,
) -> JobSpec:
    """Validate every part of a job; errors name the job and the field. Every problem is
    found, whatever the others: several are raised together, one line each."""
    if not callable(func):
        raise InvalidJobOptionError(f"job function must be callable, not {func!r}")
    job = _job_name(name, func)
    problems: list[ReplicronError] = []

    def bad(field_name: str, reason: str) -> None:
        problems.append(InvalidJobOptionError(f"job {job!r}: {field_name} {reason}"))

    def checked(value_of: Callable[[], _T]) -> _T | None:
        """``value_of()``, or ``None`` with its problem noted."""
        try:
            return value_of()
        except (InvalidJobArgumentsError, InvalidJobOptionError) as exc:
            problems.append(exc)
            return None

    # The concrete classes first: a runtime Protocol check costs tens of microseconds.
    if not isinstance(trigger, _KNOWN_TRIGGERS) and not isinstance(trigger, Trigger):
        bad("trigger", f"must be a trigger such as cron(...) or every(...), not {trigger!r}")
    if isinstance(trigger, WallClockTrigger):
        trigger = trigger.with_default_timezone(default_tz)
    if isinstance(trigger, IntervalTrigger) and not trigger.key:
        trigger = trigger.for_job(job)
    checked(lambda: _bind(job, func, args, kwargs))
    checked(lambda: _refuse_generators(job, func))
    if overlap not in _OVERLAP:
        bad("overlap", f"must be one of {', '.join(_OVERLAP)}, not {overlap!r}")
    if catch_up not in _CATCH_UP:
        bad("catch_up", f"must be one of {', '.join(_CATCH_UP)}, not {catch_up!r}")
    if leader is not None and not isinstance(leader, bool):
        bad("leader", f"must be True, False or None (the scheduler's), not {leader!r}")
    if max_runs is not None and (
        isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1
    ):
        bad("max_runs", f"must be a whole number of at least 1, not {max_runs!r}")
    aware = True
    for label, instant in (("start_at", start_at), ("stop_at", stop_at)):
        if instant is not None:
            try:
                require_aware(instant, label)
            except (TypeError, ValueError) as exc:
                bad(label, str(exc))
                aware = False
    if aware and start_at is not None and isinstance(trigger, IntervalTrigger):
        trigger = trigger.with_default_anchor(start_at)  # intervals count from start_at
    if aware and start_at is not None and stop_at is not None and stop_at <= start_at:
        bad("stop_at", f"{stop_at.isoformat()} is not after start_at {start_at.isoformat()}")
    job_tags = checked(lambda: _tags(job, tags))
    run_timeout = checked(lambda: _duration(job, "timeout", timeout, allow_zero=False))
    grace = checked(lambda: _duration(job, "misfire_grace", misfire_grace, allow_zero=True))
    if problems:
        raise _together(problems)
    assert job_tags is not None
    return JobSpec(
        name=job,
        trigger=trigger,
        func=func,
        args=tuple(args),
        kwargs=dict(kwargs),
        is_async=_is_async(func),
        tags=job_tags,
        overlap=overlap,  # type: ignore[arg-type]
        timeout=run_timeout,
        start_at=start_at,
        stop_at=stop_at,
        max_runs=max_runs,
        catch_up=catch_up,  # type: ignore[arg-type]
        misfire_grace=grace,
        leader=leader,
    )


def _together(problems: list[ReplicronError]) -> ReplicronError:
    """One error for a job's ``problems``: the problem itself when it is alone, else one
    line each, of their kind when they share one."""
    if len(problems) == 1:
        return problems[0]
    kind = type(problems[0])
    if not all(type(problem) is kind for problem in problems):
        kind = InvalidJobOptionError
    return kind("\n".join(str(problem) for problem in problems))


def _job_name(name: str | None, func: Callable[..., Any]) -> str:
    if name is not None:
        return check_job_name(name)
    qualname = getattr(func, "__qualname__", None)
    module = getattr(func, "__module__", None)
    if not isinstance(qualname, str) or "<lambda>" in qualname:
        raise InvalidJobNameError(
            f"cannot derive a job name from {func!r}: pass name=... (it identifies the job "
            "across replicas)"
        )
    return check_job_name(f"{module}.{qualname}" if module else qualname)


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None  # some builtins have no signature; nothing to check against


def _bind(
    job: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    try:
        signature = _signature(func)
    except TypeError:  # unhashable callable
        signature = inspect.signature(func)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidJobArgumentsError(
            f"job {job!r}: arguments do not fit {getattr(func, '__name__', func)}{signature}: {exc}"
        ) from None


def _refuse_generators(job: str, func: Callable[..., Any]) -> None:
    """A generator function called as a task returns a generator and runs none of its body:
    the run would be recorded succeeded with nothing done."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        kind = "an async generator" if inspect.isasyncgenfunction(target) else "a generator"
        raise InvalidJobOptionError(
            f"job {job!r}: {getattr(target, '__name__', target)} is {kind} function: calling "
            "it would run none of its body; schedule a plain function"
        )


def _is_async(func: Callable[..., Any]) -> bool:
    try:
        return _is_async_cached(func)
    except TypeError:  # unhashable callable
        return _is_async_uncached(func)


@functools.lru_cache(maxsize=1024)
def _is_async_cached(func: Callable[..., Any]) -> bool:
    return _is_async_uncached(func)


def _is_async_uncached(func: Callable[..., Any]) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004
    )


def _tags(job: str, tags: Iterable[str] | str) -> frozenset[str]:
    if isinstance(tags, str):
        items = [tags]
    else:
        try:
            items = list(tags)
        except TypeError:
            raise InvalidJobOptionError(
                f"job {job!r}: tags must be a string or strings, not {tags!r}"
            ) from None
    for tag in items:
        if not isinstance(tag, str) or not tag.strip():
            raise InvalidJobOptionError(f"job {job!r}: tags must be non-empty strings, not {tag!r}")
    return frozenset(items) if items else _NO_TAGS


def _duration(
    job: str, label: str, value: timedelta | float | None, *, allow_zero: bool
) -> timedelta | None:
    if value is None:
        return None
    delta = as_duration(value, f"job {job!r}: {label}", InvalidJobOptionError)
    if delta < timedelta(0) or (delta == timedelta(0) and not allow_zero):
        raise InvalidJobOptionError(
            f"job {job!r}: {label} must be positive, not {duration_text(delta)}"
        )
    return delta
