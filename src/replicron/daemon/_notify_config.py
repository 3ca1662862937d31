"""A daemon config's ``[notify]`` table and each job's ``ping_url``: read into the
:class:`~replicron.notify.Notifier` they make, and checked by making one, so that a bad
setting is a config problem naming the table or job and the field."""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replicron.errors import InvalidNotifierError
from replicron.notify import Notifier, check_url

from ._values import ValueProblem, parse_duration

if TYPE_CHECKING:
    from replicron.scheduler import AsyncScheduler

__all__ = [
    "NOTIFY_KEYS",
    "Alerts",
    "NotifyConfig",
    "check_alerted_jobs",
    "make_notifier",
    "read_notify",
    "read_ping_url",
]

_DURATIONS = ("timeout", "backoff", "max_backoff", "flush_timeout", "overdue_every")
_COUNTS = ("attempts", "max_queue", "error_chars")
_NAME_LISTS = ("events", "jobs", "tags", "fields")
NOTIFY_KEYS = ("url", "link", "headers", *_NAME_LISTS, *_DURATIONS, *_COUNTS)


@dataclass(frozen=True)
class NotifyConfig:
    """The ``[notify]`` table as :class:`~replicron.notify.Notifier`'s keyword arguments."""

    #: Left out of ``repr``: the URL and headers hold secrets.
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)


def read_notify(
    raw: object, where: str, expanded: Callable[[object], object], problems: list[str]
) -> NotifyConfig | None:
    """``[notify]`` (``raw``; ``None``: no such table), its problems added to ``problems``
    with ``where`` in front."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a table")
        return None
    before = len(problems)
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in NOTIFY_KEYS:
            problems.append(f"{where}: unknown setting {key!r}{_hint(key, NOTIFY_KEYS)}")
            continue
        try:
            settings[key] = _value(key, expanded(value))
        except ValueProblem as exc:
            problems.append(f"{where}: {key}: {exc}")
    if "url" not in raw:
        problems.append(f'{where}: needs a url = "https://..." to post alerts to')
    if len(problems) > before:
        return None
    try:
        Notifier(**settings)
    except InvalidNotifierError as exc:
        problems.append(f"{where}: {str(exc).removeprefix('notifier ')}")
        return None
    return NotifyConfig(settings)


def check_alerted_jobs(
    notify: NotifyConfig | None,
    jobs: Mapping[str, Sequence[str]],
    where: str,
    problems: list[str],
) -> None:
    """Add a problem for each of ``[notify]``'s ``jobs`` that is no job's name and each of its
    ``tags`` that no job has (``jobs``: each job's name and tags): misspelt, it would
    silence the alerts it was meant to select."""
    if notify is None:
        return
    tags = sorted({tag for job_tags in jobs.values() for tag in job_tags})
    for name in notify.settings.get("jobs", ()):
        if name not in jobs:
            problems.append(f"{where}: jobs: no job is named {name!r}{_hint(name, list(jobs))}")
    for tag in notify.settings.get("tags", ()):
        if tag not in tags:
            problems.append(f"{where}: tags: no job has the tag {tag!r}{_hint(tag, tags)}")


def _hint(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_ping_url(value: object) -> str:
    """A job's ``ping_url``, or :class:`ValueProblem` saying why not (secrets masked)."""
    try:
        return check_url(value)
    except InvalidNotifierError as exc:
        raise ValueProblem(str(exc)) from None


def _value(key: str, value: object) -> object:
    if key in _DURATIONS:
        return parse_duration(value).total_seconds()
    if key in _COUNTS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueProblem(f"must be a whole number of at least 1, not {value!r}")
        return value
    if key in _NAME_LISTS:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueProblem(f"must be a string or a list of strings, not {value!r}")
        return tuple(items)
    if key == "headers":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ValueProblem('must be a table of strings, such as { Authorization = "..." }')
        return dict(value)
    if not isinstance(value, str):  # url, link
        raise ValueProblem("must be a string")
    return value


def make_notifier(
    notify: NotifyConfig | None, pings: Sequence[tuple[str, str]], namespace: str
) -> Notifier | None:
    """The daemon's notifier: ``[notify]``'s alerts and the jobs' pings (``None``: neither)."""
    if notify is None and not pings:
        return None
    settings = {} if notify is None else dict(notify.settings)
    return Notifier(**settings, pings=dict(pings), namespace=namespace)


class Alerts:
    """The daemon's notifier: attached to its scheduler (and counted in its metrics'
    registry, when the metrics extra is there), and replaced by a reload that changes it."""

    def __init__(self, scheduler: AsyncScheduler, namespace: str, registry: Any) -> None:
        self._scheduler, self._namespace, self._registry = scheduler, namespace, registry
        self._given: tuple[NotifyConfig | None, list[tuple[str, str]]] = (None, [])
        self._notifier: Notifier | None = None
        self._detach: Callable[[], None] | None = None
        self._metrics: Any = None

    def apply(self, notify: NotifyConfig | None, pings: list[tuple[str, str]]) -> None:
        self._given = (notify, pings)
        self._notifier = make_notifier(notify, pings, self._namespace)
        if self._notifier is None:
            return
        self._detach = self._notifier.attach(self._scheduler)
        if self._registry is not None:
            from replicron.metrics import NotifierCollector  # the metrics extra is there

            self._metrics = NotifierCollector(self._notifier)
            self._registry.register(self._metrics)

    async def reload(self, notify: NotifyConfig | None, pings: list[tuple[str, str]]) -> None:
        """The old notifier delivers what it holds (off the loop) as the new takes over."""
        if (notify, pings) == self._given:
            return
        old = self._notifier
        if self._detach is not None:
            self._detach()
            self._detach = None
        if self._metrics is not None:
            self._registry.unregister(self._metrics)
            self._metrics = None
        self.apply(notify, pings)
        if old is not None:
            await asyncio.to_thread(old.close)
