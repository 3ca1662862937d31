"""A daemon config: the TOML file, with ``${VAR}`` expanded and ``REPLICRON_*`` settings from
the environment on top, checked into plain values. Every problem is collected, one line each,
so that a bad file is fixed in one go; nothing here imports a job's code or runs anything."""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from replicron.errors import ConfigurationError
from replicron.keys import check_job_name, check_namespace, check_replica_id

from ._notify_config import NotifyConfig, check_alerted_jobs, read_notify, read_ping_url
from ._values import (
    ValueProblem,
    expand,
    parse_command,
    parse_duration,
    parse_http,
    parse_instant,
)

__all__ = [
    "TRIGGER_KEYS",
    "ConfigError",
    "DaemonConfig",
    "JobConfig",
    "SchedulerConfig",
    "load_config",
    "parse_config",
    "restarted_settings_kept",
    "with_replica_id",
]


class ConfigError(ConfigurationError):
    """A daemon config that cannot run; ``problems`` holds one line per thing to fix."""

    def __init__(
        self,
        problems: list[str],
        partial: DaemonConfig | None = None,
        broken_fields: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        #: The settings and the jobs that could be read (a field with a problem left at its
        #: default), for the library's checks to find their problems too: a bad file is then
        #: fixed in one go.
        self.partial = partial
        #: Of the jobs in ``partial``, by name: the fields that had a problem. What depends
        #: on them is not checked again (it would only repeat the problem).
        self.broken_fields = dict(broken_fields or {})


@dataclass(frozen=True)
class SchedulerConfig:
    timezone: str = "UTC"
    state_dir: str | None = None
    database_url: str | None = None
    namespace: str = ""
    replica_id: str | None = None
    stop_timeout: timedelta = timedelta(seconds=30)
    max_workers: int = 16
    max_concurrent_jobs: int | None = None
    concurrency_mode: str = "queue"
    http: tuple[str, int] | None = None
    heartbeat_interval: timedelta = timedelta(seconds=5)
    stale_after: timedelta | None = None
    log_level: str = "INFO"
    log_format: str = "text"
    migrate: bool = True
    session_pooler: bool = False
    coordination: str = "advisory"
    leader: bool = False  # leader mode for the jobs that do not say

    @property
    def backend_kind(self) -> str:
        return "postgres" if self.database_url else "embedded"


@dataclass(frozen=True)
class JobConfig:
    name: str
    trigger: str  # one of TRIGGER_KEYS
    schedule: Any  # the trigger key's value, as written (expanded)
    seconds: bool = False
    at: tuple[str, ...] = ("00:00",)
    tz: str | None = None
    jitter: timedelta | None = None
    command: tuple[str, ...] | None = None
    shell: bool = False
    call: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    timeout: timedelta | None = None
    kill_grace: timedelta = timedelta(seconds=10)
    overlap: str = "skip"
    catch_up: str = "latest"
    misfire_grace: timedelta | None = None
    tags: tuple[str, ...] = ()
    start_at: datetime | None = None
    stop_at: datetime | None = None
    max_runs: int | None = None
    ping_url: str | None = field(default=None, repr=False)  # a secret (a check's UUID)
    leader: bool | None = None  # None: as the scheduler's


@dataclass(frozen=True)
class DaemonConfig:
    path: str
    scheduler: SchedulerConfig
    jobs: tuple[JobConfig, ...] = field(default=())
    notify: NotifyConfig | None = None


def with_replica_id(config: DaemonConfig, replica_id: str) -> DaemonConfig:
    """``config`` with ``replica_id`` as its replica's id, every other setting as it is."""
    settings = dataclasses.replace(config.scheduler, replica_id=replica_id)
    return dataclasses.replace(config, scheduler=settings)


def restarted_settings_kept(
    running: DaemonConfig, reloaded: DaemonConfig, restart_only: tuple[str, ...]
) -> DaemonConfig:
    """``reloaded`` with the ``restart_only`` settings of the ``running`` config: a reload
    applies everything else, and those wait for the next restart."""
    kept = {key: getattr(running.scheduler, key) for key in restart_only}
    return dataclasses.replace(reloaded, scheduler=dataclasses.replace(reloaded.scheduler, **kept))


#: Worker threads for ``call`` jobs at most (each is a thread, made when the daemon starts).
MAX_WORKERS = 1024

#: How a job says when it runs: exactly one of these per job.
TRIGGER_KEYS = ("cron", "every", "after", "between", "daily", "weekly", "monthly", "once")
_JOB_KEYS = (
    "name",
    *TRIGGER_KEYS,
    "seconds",
    "at",
    "tz",
    "jitter",
    "command",
    "shell",
    "call",
    "args",
    "kwargs",
    "env",
    "cwd",
    "timeout",
    "kill_grace",
    "overlap",
    "catch_up",
    "misfire_grace",
    "tags",
    "start_at",
    "stop_at",
    "max_runs",
    "ping_url",
    "leader",
)
_SCHEDULER_KEYS = tuple(f for f in SchedulerConfig.__dataclass_fields__)
#: The options that only some triggers use: elsewhere they would be silently ignored.
_USED_BY = {
    "seconds": ("cron",),
    "at": ("weekly", "monthly"),
    "tz": ("cron", "daily", "weekly", "monthly"),
    "jitter": ("every",),
}
_TABLES = ("scheduler", "job", "notify")
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

#: Options of the other kind of task, refused rather than ignored.
_TASK_KEYS = {
    "command": ("args", "kwargs"),
    "call": ("env", "cwd", "shell", "kill_grace"),
}
_OTHER = {"command": "call", "call": "command"}
_CHOICES = {
    "overlap": ("skip", "queue", "allow"),
    "catch_up": ("latest", "none", "all"),
    "concurrency_mode": ("queue", "skip"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"),
    "log_format": ("text", "json"),
    "coordination": ("advisory", "lease"),
}


def load_config(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> DaemonConfig:
    """Read and check the config at ``path``; raises :class:`ConfigError`."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError([f"{name}: cannot read it: {problem}"]) from None
    try:
        return parse_config(text, name, os.environ if environ is None else environ)
    except RecursionError:
        raise ConfigError([f"{name}: values nested too deeply"]) from None


def parse_config(text: str, path: str, environ: Mapping[str, str]) -> DaemonConfig:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    problems: list[str] = []
    reader = _Reader(path, environ, problems)
    for key in document:
        if key not in _TABLES:
            problems.append(f"{path}: unknown table [{key!r}]{_suggest(key, _TABLES)}")
    scheduler = reader.scheduler(document.get("scheduler", {}))
    notify = read_notify(document.get("notify"), f"{path}: [notify]", reader.expanded, problems)
    raw_jobs = document.get("job", [])
    jobs: list[JobConfig] = []
    if not isinstance(raw_jobs, list):
        problems.append(f"{path}: jobs are written [[job]] (an array of tables), not [job]")
        raw_jobs = []
    seen: set[str] = set()
    broken_fields: dict[str, frozenset[str]] = {}
    for index, raw in enumerate(raw_jobs, 1):
        job = reader.job(raw, index)
        if job is None:
            continue
        if job.name in seen:
            problems.append(f"{path}: job {job.name!r}: a second job has the same name")
            continue
        seen.add(job.name)
        if reader.broken:
            broken_fields[job.name] = reader.broken
        jobs.append(job)
    if not problems:  # a bad job table would make every name it lists look unknown
        named = {job.name: job.tags for job in jobs}
        check_alerted_jobs(notify, named, f"{path}: [notify]", problems)
    if problems:
        partial = DaemonConfig(path, scheduler, tuple(jobs), notify)
        raise ConfigError(problems, partial, broken_fields)
    return DaemonConfig(path, scheduler, tuple(jobs), notify)


def _suggest(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Reader:
    def __init__(self, path: str, environ: Mapping[str, str], problems: list[str]) -> None:
        self.path, self.environ, self.problems = path, environ, problems
        #: The fields of the job read last that had a problem.
        self.broken: frozenset[str] = frozenset()

    # ---- [scheduler] -------------------------------------------------------------------

    def scheduler(self, raw: object) -> SchedulerConfig:
        where = f"{self.path}: [scheduler]"
        if not isinstance(raw, dict):
            self.problems.append(f"{where} must be a table")
            return SchedulerConfig()
        table = dict(raw)
        for key in table:
            if key not in _SCHEDULER_KEYS:
                self.problems.append(
                    f"{where}: unknown setting {key!r}{_suggest(key, _SCHEDULER_KEYS)}"
                )
        from_env = {k: f"REPLICRON_{k.upper()}" for k in _SCHEDULER_KEYS}
        given = {k: v for k, v in from_env.items() if self.environ.get(v, "") != ""}
        if "database_url" in given and "state_dir" not in given:
            table.pop("state_dir", None)  # the environment picks the backend over the file
        if "state_dir" in given and "database_url" not in given:
            table.pop("database_url", None)
        values: dict[str, Any] = {}
        for key in _SCHEDULER_KEYS:
            label = f"{where}: {key}"
            if key in given:
                value: object = self.environ[given[key]]
                label = f"{self.path}: {given[key]} (environment)"
            elif key in table:
                value = table[key]
            else:
                continue
            try:
                # An environment variable's value is the value: not expanded again.
                value = value if key in given else self.expanded(value)
                values[key] = self._scheduler_value(key, value, key in given)
            except ValueProblem as exc:
                self.problems.append(f"{label}: {exc}")
        heartbeat = values.get("heartbeat_interval", SchedulerConfig.heartbeat_interval)
        stale_after = values.get("stale_after")
        if stale_after is not None and stale_after <= heartbeat:
            self.problems.append(
                f"{where}: stale_after ({stale_after}) must exceed heartbeat_interval ({heartbeat})"
            )
        lease = values.get("coordination") == "lease"
        if lease and not values.get("database_url"):
            self.problems.append(f"{where}: coordination 'lease' is PostgreSQL's (database_url)")
        elif lease and values.get("session_pooler"):
            self.problems.append(f"{where}: session_pooler is advisory coordination's: unset it")
        if values.get("database_url") and values.get("state_dir"):
            self.problems.append(
                f"{where}: set database_url (PostgreSQL) or state_dir (embedded), not both"
            )
        return SchedulerConfig(**values)

    def _scheduler_value(self, key: str, value: object, textual: bool) -> object:
        if key in ("stop_timeout",):
            return parse_duration(value, allow_zero=True)
        if key in ("heartbeat_interval", "stale_after"):
            return parse_duration(value)
        if key == "http":
            return parse_http(value)
        if key in ("max_workers", "max_concurrent_jobs"):
            if textual and isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueProblem(f"must be a whole number of at least 1, not {value!r}")
            if key == "max_workers" and value > MAX_WORKERS:
                raise ValueProblem(f"must be at most {MAX_WORKERS} (a thread each), not {value!r}")
            return value
        if key in ("migrate", "session_pooler", "leader"):
            if textual and isinstance(value, str) and value.strip().lower() in _BOOLEANS:
                value = _BOOLEANS[value.strip().lower()]
            if not isinstance(value, bool):
                raise ValueProblem(f"must be true or false, not {value!r}")
            return value
        if key in ("log_level",) and isinstance(value, str):
            value = value.upper()
        if key in ("coordination",) and isinstance(value, str):
            value = value.strip().lower()
        text = _string(value)
        if key in _CHOICES and text not in _CHOICES[key]:
            raise ValueProblem(
                f"must be one of {', '.join(map(repr, _CHOICES[key]))}, not {text!r}"
            )
        if key in ("replica_id", "timezone", "state_dir", "database_url") and not text.strip():
            raise ValueProblem("must not be empty")
        identity = {"namespace": check_namespace, "replica_id": check_replica_id}.get(key)
        if identity is not None:
            try:
                identity(text)
            except ConfigurationError as exc:
                raise ValueProblem(str(exc).removeprefix(f"{key} ")) from None
        return text

    # ---- [[job]] -----------------------------------------------------------------------

    def job(self, raw: object, index: int) -> JobConfig | None:
        """The job of ``raw`` (its problems added to the reader's), or ``None`` when it has
        no name, trigger or task to check it by."""
        where = f"{self.path}: job #{index}"
        if not isinstance(raw, dict):
            self.problems.append(f"{where} must be a table")
            return None
        name = raw.get("name")
        try:
            name = check_job_name(name) if name is not None else None
        except ConfigurationError as exc:
            self.problems.append(f"{where}: name: {exc}")
            name = None
        else:
            if name is None:
                self.problems.append(
                    f'{where}: needs a name (name = "..."), the job\'s identity across replicas'
                )
            else:
                where = f"{self.path}: job {name!r}"
        # A job without a usable name is read on, for its other problems to be listed too.
        for key in raw:
            if key not in _JOB_KEYS:
                self.problems.append(f"{where}: unknown option {key!r}{_suggest(key, _JOB_KEYS)}")
        values: dict[str, Any] = {"name": name}
        triggers = [key for key in TRIGGER_KEYS if key in raw]
        unused: set[str] = set()
        if len(triggers) != 1:
            said = "has " + " and ".join(triggers) if triggers else "has none"
            self.problems.append(
                f"{where}: needs exactly one of {', '.join(TRIGGER_KEYS)} to say when it runs; "
                f"it {said}"
            )
        else:
            values["trigger"] = triggers[0]
            for key, kinds in _USED_BY.items():
                if key in raw and triggers[0] not in kinds:
                    self.problems.append(
                        f"{where}: {key}: applies to {' and '.join(kinds)} jobs, not to "
                        f"{triggers[0]} (remove it)"
                    )
                    unused.add(key)  # nor read: its value would only add a second line
            try:
                values["schedule"] = self.expanded(raw[triggers[0]])
            except ValueProblem as exc:
                self.problems.append(f"{where}: {triggers[0]}: {exc}")
        task = [key for key in ("command", "call") if key in raw]
        if len(task) != 1:
            self.problems.append(
                f'{where}: needs a command = [...] to run or a call = "module:function"; '
                + ("it has both" if task else "it has neither")
            )
        else:
            for key in _TASK_KEYS[task[0]]:
                if key in raw:
                    self.problems.append(
                        f"{where}: {key}: applies to {_OTHER[task[0]]} jobs, not to {task[0]} "
                        "jobs (remove it)"
                    )
        broken = set()
        for key, value in raw.items():
            if key in ("name", *TRIGGER_KEYS, *unused) or key not in _JOB_KEYS:
                continue
            label = f"{where}: {key}"
            try:
                # A shell script is left for the shell to expand, as data: pasted into its
                # text, a value could change what the script does.
                shell_text = key == "command" and raw.get("shell") is True
                expanded = value if shell_text else self.expanded(value)
                values[key] = self._job_value(key, expanded, raw)
            except ValueProblem as exc:
                self.problems.append(f"{label}: {exc}")
                broken.add(key)
        if name is None or "trigger" not in values or "schedule" not in values:
            return None
        if len(task) != 1 or task[0] not in values:
            return None
        self.broken = frozenset(broken)
        # With a problem in its other options, the job is still checked by the library (its
        # trigger and task), with those options left at their defaults.
        return JobConfig(**values)

    def _job_value(self, key: str, value: object, raw: Mapping[str, object]) -> object:
        if key in ("timeout", "misfire_grace", "jitter"):
            return parse_duration(value)
        if key == "kill_grace":
            return parse_duration(value, allow_zero=True)
        if key in ("start_at", "stop_at"):
            return parse_instant(value)
        if key == "ping_url":
            return read_ping_url(value)
        if key in ("seconds", "shell", "leader"):
            if not isinstance(value, bool):
                raise ValueProblem(f"must be true or false, not {value!r}")
            return value
        if key == "max_runs":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueProblem(f"must be a whole number of at least 1, not {value!r}")
            return value
        if key == "command":
            return parse_command(value, raw.get("shell") is True)
        if key == "call":
            text = _string(value)
            module, colon, attribute = text.partition(":")
            if not colon or not module or not attribute:
                raise ValueProblem(
                    f'must be "module:function", such as "myapp.tasks:poll", not {text!r}'
                )
            return text
        if key == "args":
            if not isinstance(value, list):
                raise ValueProblem(f"must be a list of arguments, not {value!r}")
            return tuple(value)
        if key == "kwargs":
            if not isinstance(value, dict):
                raise ValueProblem(f"must be a table of keyword arguments, not {value!r}")
            return tuple(sorted(value.items()))
        if key == "env":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ValueProblem('must be a table of strings, such as { LANG = "C.UTF-8" }')
            for name, text in value.items():
                if not name or "=" in name or "\0" in name or "\0" in text:
                    raise ValueProblem(
                        f"{name!r}: a variable's name must be non-empty, without '=' or NUL, "
                        "and its value without NUL"
                    )
            return tuple(sorted(value.items()))
        if key in ("tags", "at"):
            items = [value] if isinstance(value, str) else value
            if (
                not isinstance(items, list)
                or not items
                or not all(isinstance(i, str) for i in items)
            ):
                raise ValueProblem(f"must be a string or a list of strings, not {value!r}")
            return tuple(items)
        text = _string(value)
        if key in _CHOICES and text not in _CHOICES[key]:
            raise ValueProblem(
                f"must be one of {', '.join(map(repr, _CHOICES[key]))}, not {text!r}"
            )
        return text

    def expanded(self, value: object) -> object:
        """``value`` with ``${VAR}`` expanded in every string inside it."""
        if isinstance(value, str):
            return expand(value, self.environ)
        if isinstance(value, list):
            return [self.expanded(item) for item in value]
        if isinstance(value, dict):
            return {k: self.expanded(v) for k, v in value.items()}
        return value


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise ValueProblem(f"must be a string, not {value!r}")
    if "\0" in value:
        raise ValueProblem(f"holds a NUL character: {value!r}")
    return value
