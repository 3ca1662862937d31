"""The daemon's config (src/replicron/daemon/config.py, _values.py, _build.py): every problem
of a bad file is reported, one line each and all at once; and what a good file means
(durations, ``${VAR}``, ``REPLICRON_*`` settings, every kind of trigger). Nothing here starts
a scheduler's loop, sleeps, or touches the network."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from replicron.daemon import ConfigError, DaemonConfig, JobConfig, check_config
from replicron.daemon._build import make_trigger, options_of
from replicron.daemon._daemon import make_backend, make_scheduler, preview, validate
from replicron.daemon.config import (
    SchedulerConfig,
    load_config,
    parse_config,
    restarted_settings_kept,
    with_replica_id,
)
from replicron.postgres import PostgresBackend
from replicron.triggers import after, upcoming

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: A job's lines with everything but its trigger, for rows about one trigger.
TASK = 'command = ["true"]\n'


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking a ``call`` puts the config's directory on sys.path: undone after each test.
    And no REPLICRON_* setting of the test run's own reaches check_config."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in os.environ if n.startswith("REPLICRON_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory for the rows that name files: a script that is not executable, a plain
    file, and an empty bin directory."""
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "bin").mkdir()
    return tmp_path


def config_path(where: Path) -> str:
    return str(where / "jobs.toml")


def problems_of(text: str, where: Path, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every problem ``replicron check`` would report for ``text`` (``@TMP@`` stands for
    ``where``): the parser's, then the library's when the jobs that parsed are added."""
    text = text.replace("@TMP@", str(where))
    try:
        config = parse_config(text, config_path(where), {} if environ is None else environ)
    except ConfigError as exc:
        error = exc
    else:
        return asyncio.run(validate(config))
    assert str(error) == "\n".join(error.problems)
    if error.partial is None:  # not TOML: nothing was read
        return error.problems
    return error.problems + asyncio.run(validate(error.partial, error.broken_fields))


def parsed(text: str, environ: Mapping[str, str] | None = None) -> DaemonConfig:
    return parse_config(text, "jobs.toml", {} if environ is None else environ)


def one_job(text: str, environ: Mapping[str, str] | None = None) -> JobConfig:
    config = parsed(text, environ)
    assert len(config.jobs) == 1
    return config.jobs[0]


def assert_one_line_each(problems: list[str], where: Path) -> None:
    for line in problems:
        assert "\n" not in line, line
        assert "\r" not in line, line
        assert line.startswith(config_path(where) + ": "), line
        assert "Traceback" not in line


def assert_each_once(problems: list[str], expected: list[str], where: Path) -> None:
    """One line per problem, and each of ``expected`` in exactly one of them."""
    assert_one_line_each(problems, where)
    assert len(problems) == len(expected), problems
    for fragment in expected:
        assert sum(fragment in line for line in problems) == 1, (fragment, problems)


def job(body: str, name: str = "j") -> str:
    return f'[[job]]\nname = "{name}"\n{body}'


# ---- the table of bad configs ----------------------------------------------------------------

BAD = [
    pytest.param(
        '[scheduler]\ndatabase_url = "mysql://app:hunter2@db/jobs"\n',
        "[scheduler]: database_url: not a valid PostgreSQL connection string",
        id="database-url-not-postgresql",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'args = ["x"]\n'),
        "job 'j': args: applies to call jobs, not to command jobs (remove it)",
        id="args-on-a-command",
    ),
    pytest.param(
        job('every = "1m"\ncall = "os:getcwd"\nenv = { A = "b" }\n'),
        "job 'j': env: applies to command jobs, not to call jobs (remove it)",
        id="env-on-a-call",
    ),
    pytest.param(
        '[scheduler]\nmigrate = "no"\n',
        "[scheduler]: migrate: must be true or false, not 'no'",
        id="migrate-not-a-bool",
    ),
    pytest.param(
        "[scheduler]\nmax_workers = 100000\n",
        "[scheduler]: max_workers: must be at most 1024 (a thread each), not 100000",
        id="max-workers-too-many",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["echo", "a\\u0000b"]\n'),
        "job 'j': command: an argument holds a NUL character",
        id="nul-in-argv",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'env = { "A=B" = "x" }\n'),
        "job 'j': env: 'A=B': a variable's name must be non-empty, without '='",
        id="env-name-with-equals",
    ),
    pytest.param(
        '[scheduler]\nstate_dir = "/tmp/x\\u0000y"\n',
        "[scheduler]: state_dir: holds a NUL character",
        id="nul-in-setting",
    ),
    pytest.param(
        '["a\\nb"]\nx = 1\n',
        "unknown table ['a\\nb']",
        id="unknown-table-with-newline",
    ),
    pytest.param('[scheduler\ntimezone = "UTC"\n', "not valid TOML: ", id="toml-syntax"),
    pytest.param("a = 1\na = 2\n", "not valid TOML: Cannot overwrite a value", id="toml-dup-key"),
    pytest.param(
        '[schedulr]\ntimezone = "UTC"\n',
        "unknown table ['schedulr'] (did you mean 'scheduler'?)",
        id="unknown-table",
    ),
    pytest.param(
        '[scheduler]\ntimezon = "UTC"\n',
        "[scheduler]: unknown setting 'timezon' (did you mean 'timezone'?)",
        id="unknown-setting",
    ),
    pytest.param(
        "[scheduler]\nfrobnicate = 1\n",
        "[scheduler]: unknown setting 'frobnicate'",
        id="unknown-setting-no-match",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'timout = "5s"\n'),
        "job 'j': unknown option 'timout' (did you mean 'timeout'?)",
        id="unknown-option",
    ),
    pytest.param(
        '[[job]]\nevery = "1m"\n' + TASK,
        'job #1: needs a name (name = "...")',
        id="missing-name",
    ),
    pytest.param(
        '[[job]]\nname = ""\nevery = "1m"\n' + TASK,
        "job #1: name: job name must not be empty",
        id="empty-name",
    ),
    pytest.param(
        '[[job]]\nname = 5\nevery = "1m"\n' + TASK,
        "job #1: name: job name must be a str, not int",
        id="name-not-a-string",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK) + job('cron = "* * * * *"\n' + TASK),
        "job 'j': a second job has the same name",
        id="duplicate-names",
    ),
    pytest.param(
        job(TASK),
        "job 'j': needs exactly one of cron, every, after, between, daily, weekly, monthly, "
        "once to say when it runs; it has none",
        id="no-trigger",
    ),
    pytest.param(
        job('every = "1m"\ncron = "* * * * *"\n' + TASK),
        "to say when it runs; it has cron and every",
        id="two-triggers",
    ),
    pytest.param(
        job('every = "1m"\n'),
        "job 'j': needs a command = [...] to run or a call = \"module:function\"; it has neither",
        id="no-command-or-call",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'call = "os:getcwd"\n'),
        "; it has both",
        id="command-and-call",
    ),
    pytest.param(
        job('every = "1m"\ncommand = "echo hi"\n'),
        "job 'j': command: must be a list of arguments such as ['echo', 'hi'] (no shell "
        "parses it), or set shell = true",
        id="command-string-without-shell",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["echo", "hi"]\nshell = true\n'),
        "command: with shell = true, must be one string of shell script",
        id="shell-with-a-list",
    ),
    pytest.param(
        job('every = "1m"\ncommand = []\n'),
        "command: must be a non-empty list of strings, not []",
        id="empty-command",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["", "x"]\n'),
        "command: its first item, the program, is empty",
        id="empty-program",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["echo", 1]\n'),
        "command: must be a non-empty list of strings, not ['echo', 1]",
        id="command-not-strings",
    ),
    pytest.param(
        job('every = "10 minutes"\n' + TASK),
        "job 'j': every: '10 minutes' is not a duration: write a number and a unit",
        id="duration-in-words",
    ),
    pytest.param(job('every = "-5s"\n' + TASK), "'-5s'", id="duration-negative"),
    pytest.param(
        job('every = "1m"\n' + TASK + 'timeout = "0s"\n'),
        "job 'j': timeout: must be longer than 0, not '0s'",
        id="timeout-zero",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "timeout = -3\n"),
        "timeout: must be longer than 0, not -3",
        id="timeout-negative-number",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'timeout = "abc"\n'),
        "timeout: 'abc' is not a duration",
        id="duration-abc",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "timeout = true\n"),
        'timeout: must be a duration such as "90s", "10m" or "2h", not True',
        id="duration-boolean",
    ),
    pytest.param(
        job('every = "100000d"\n' + TASK),
        "every: '100000d' is longer than ten years",
        id="duration-too-long",
    ),
    pytest.param(
        job('cron = "60 * * * *"\n' + TASK),
        "job 'j': cron: '60' is out of range 0-59 in the minute field",
        id="cron-out-of-range",
    ),
    pytest.param(
        job('cron = "* * * *"\n' + TASK),
        "job 'j': cron: ",
        id="cron-four-fields",
    ),
    pytest.param(
        job('cron = "* * * * *"\nseconds = true\n' + TASK),
        "cron: expected 6 fields, got 5",
        id="cron-seconds-but-five-fields",
    ),
    pytest.param(
        job("cron = 5\n" + TASK),
        "cron: must be a cron expression string, not 5",
        id="cron-not-a-string",
    ),
    pytest.param(
        '[scheduler]\ntimezone = "Mars/Base"\n',
        "[scheduler]: unknown time zone 'Mars/Base'",
        id="scheduler-timezone",
    ),
    pytest.param('[scheduler]\ntimezone = ""\n', "timezone: must not be empty", id="tz-empty"),
    pytest.param(
        job('cron = "0 * * * *"\ntz = "Mars/Base"\n' + TASK),
        "unknown time zone 'Mars/Base'",
        id="job-tz",
    ),
    pytest.param(
        job('daily = "03:00"\ntz = "Europe/Atlantis"\n' + TASK),
        "unknown time zone 'Europe/Atlantis'",
        id="daily-tz",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'overlap = "sometimes"\n'),
        "job 'j': overlap: must be one of 'skip', 'queue', 'allow', not 'sometimes'",
        id="overlap-choice",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'catch_up = "every"\n'),
        "job 'j': catch_up: must be one of 'latest', 'none', 'all', not 'every'",
        id="catch-up-choice",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "max_runs = 0\n"),
        "job 'j': max_runs: must be a whole number of at least 1, not 0",
        id="max-runs-zero",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "start_at = 2030-01-01T00:00:00\n"),
        "job 'j': start_at: 2030-01-01T00:00:00 has no UTC offset: write it as "
        "2030-01-01T00:00:00Z",
        id="start-at-without-offset",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + 'start_at = "next tuesday"\n'),
        "start_at: 'next tuesday' is not an ISO-8601 date-time",
        id="start-at-not-a-date",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "start_at = 2030-01-01\n"),
        "start_at: 2030-01-01 must be a date and a time with a UTC offset",
        id="start-at-a-date",
    ),
    pytest.param(
        job(
            'every = "1m"\n' + TASK + "start_at = 2030-01-02T00:00:00Z\n"
            "stop_at = 2030-01-01T00:00:00Z\n"
        ),
        "stop_at 2030-01-01T00:00:00+00:00 is not after start_at 2030-01-02T00:00:00+00:00",
        id="stop-at-before-start-at",
    ),
    pytest.param(
        '[scheduler]\nhttp = "localhost:99999"\n',
        "[scheduler]: http: 'localhost:99999' needs a port from 1 to 65535",
        id="http-port",
    ),
    pytest.param(
        '[scheduler]\nhttp = "localhost"\n',
        "[scheduler]: http: 'localhost' needs a port from 1 to 65535",
        id="http-no-port",
    ),
    pytest.param(
        "[scheduler]\nhttp = true\n",
        '[scheduler]: http: must be "host:port", such as "127.0.0.1:9464", not True',
        id="http-boolean",
    ),
    pytest.param(
        '[scheduler]\nstate_dir = "@TMP@/state"\ndatabase_url = "postgresql://u@h/d"\n',
        "[scheduler]: set database_url (PostgreSQL) or state_dir (embedded), not both",
        id="both-backends",
    ),
    pytest.param(
        "[scheduler]\nmax_workers = 0\n",
        "[scheduler]: max_workers: must be a whole number of at least 1, not 0",
        id="max-workers-zero",
    ),
    pytest.param(
        '[scheduler]\nmax_workers = "7"\n',
        "max_workers: must be a whole number of at least 1, not '7'",
        id="max-workers-text-in-file",
    ),
    pytest.param(
        '[scheduler]\nlog_level = "loud"\n',
        "log_level: must be one of 'DEBUG', 'INFO', 'WARNING', 'ERROR', not 'LOUD'",
        id="log-level",
    ),
    pytest.param(
        '[scheduler]\nconcurrency_mode = "drop"\n',
        "concurrency_mode: must be one of 'queue', 'skip', not 'drop'",
        id="concurrency-mode",
    ),
    pytest.param(
        '[scheduler]\ncoordination = "locks"\n',
        "coordination: must be one of 'advisory', 'lease', not 'locks'",
        id="coordination",
    ),
    pytest.param(
        '[scheduler]\nstate_dir = "/st"\ncoordination = "lease"\n',
        "[scheduler]: coordination 'lease' is PostgreSQL's (database_url)",
        id="lease-on-embedded",
    ),
    pytest.param(
        '[scheduler]\ndatabase_url = "postgresql://h/d"\ncoordination = "lease"\n'
        "session_pooler = true\n",
        "[scheduler]: session_pooler is advisory coordination's: unset it",
        id="lease-with-session-pooler",
    ),
    pytest.param(
        '[scheduler]\nstale_after = "0s"\n',
        "[scheduler]: stale_after: must be longer than 0, not '0s'",
        id="stale-after-zero",
    ),
    pytest.param("scheduler = 3\n", "[scheduler] must be a table", id="scheduler-not-a-table"),
    pytest.param(
        job('every = "1m"\ncommand = ["echo", "${NOPE}"]\n'),
        "job 'j': command: ${NOPE} is not set in the environment (or write ${NOPE:-default})",
        id="unset-variable",
    ),
    pytest.param(
        '[scheduler]\nstate_dir = "${STATE}"\n',
        "[scheduler]: state_dir: ${STATE} is not set in the environment",
        id="unset-variable-in-scheduler",
    ),
    pytest.param(
        job('cron = "${SCHEDULE}"\n' + TASK),
        "job 'j': cron: ${SCHEDULE} is not set",
        id="unset-variable-in-trigger",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["echo", "${1X}"]\n'),
        "command: ${1X} is not a variable reference (write ${NAME})",
        id="bad-reference",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["echo", "${}"]\n'),
        "command: ${} is not a variable reference",
        id="empty-reference",
    ),
    pytest.param(
        job('every = "1m"\ncall = "os.getcwd"\n'),
        "job 'j': call: must be \"module:function\", such as \"myapp.tasks:poll\", not 'os.getcwd'",
        id="call-without-colon",
    ),
    pytest.param(
        job('every = "1m"\ncall = ":getcwd"\n'),
        'call: must be "module:function"',
        id="call-without-module",
    ),
    pytest.param(
        job('every = "1m"\ncall = "replicron_no_such_module:poll"\n'),
        "job 'j': call: cannot import 'replicron_no_such_module': No module named "
        "'replicron_no_such_module'",
        id="call-missing-module",
    ),
    pytest.param(
        job('every = "1m"\ncall = "os.path:no_such_function"\n'),
        "job 'j': call: module 'os.path' has no 'no_such_function'",
        id="call-missing-attribute",
    ),
    pytest.param(
        job('every = "1m"\ncall = "math:pi"\n'),
        "job 'j': call: 'math:pi' is not callable (float)",
        id="call-not-callable",
    ),
    pytest.param(
        job('every = "1m"\ncall = "math:sqrt"\nargs = [1, 2]\n'),
        "job 'j': arguments do not fit sqrt(x, /): too many positional arguments",
        id="call-too-many-args",
    ),
    pytest.param(
        job('every = "1m"\ncall = "operator:add"\nargs = [1]\nkwargs = { c = 2 }\n'),
        "job 'j': arguments do not fit add(a, b, /): ",
        id="call-unknown-keyword",
    ),
    pytest.param(
        job('every = "1m"\ncall = "math:sqrt"\nargs = 4\n'),
        "args: must be a list of arguments, not 4",
        id="args-not-a-list",
    ),
    pytest.param(
        job('every = "1m"\ncall = "math:sqrt"\nkwargs = [4]\n'),
        "kwargs: must be a table of keyword arguments, not [4]",
        id="kwargs-not-a-table",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["replicron-no-such-program"]\n'),
        "job 'j': command: 'replicron-no-such-program' is not found on PATH",
        id="program-not-on-path",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["true"]\nenv = { PATH = "@TMP@/bin" }\n'),
        "job 'j': command: 'true' is not found on PATH (@TMP@/bin)",
        id="program-not-on-the-jobs-path",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["@TMP@/not-executable.sh"]\n'),
        "job 'j': command: '@TMP@/not-executable.sh' is not executable",
        id="program-not-executable",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["./missing.sh"]\ncwd = "@TMP@"\n'),
        "job 'j': command: './missing.sh' does not exist (looked in '@TMP@')",
        id="program-path-missing",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["true"]\ncwd = "@TMP@/a-file"\n'),
        "job 'j': cwd: '@TMP@/a-file' is not a directory",
        id="cwd-a-file",
    ),
    pytest.param(
        job('every = "1m"\ncommand = ["true"]\ncwd = "@TMP@/nowhere"\n'),
        "job 'j': cwd: '@TMP@/nowhere' is not a directory",
        id="cwd-missing",
    ),
    pytest.param(
        job('weekly = "funday"\n' + TASK),
        "job 'j': weekly: unknown weekday 'funday'",
        id="weekly-bad-day",
    ),
    pytest.param(
        job('weekly = ["mon"]\nat = "9:75"\n' + TASK),
        "job 'j': weekly: ",
        id="weekly-bad-at",
    ),
    pytest.param(
        job('daily = "25:00"\n' + TASK),
        "job 'j': daily: hour 25 in '25:00' is out of range 0-23",
        id="daily-bad-time",
    ),
    pytest.param(
        job("daily = 3\n" + TASK),
        'daily: must be a time of day such as "03:00", or a list of them, not 3',
        id="daily-not-a-time",
    ),
    pytest.param(
        job("monthly = 32\n" + TASK),
        "job 'j': monthly: day of month 32 is out of range 1..31",
        id="monthly-bad-day",
    ),
    pytest.param(
        job('between = ["5m"]\n' + TASK),
        'between: must be two durations, such as ["1m", "5m"], not [\'5m\']',
        id="between-one-value",
    ),
    pytest.param(
        job('between = ["5m", "1m"]\n' + TASK),
        "job 'j': between: ",
        id="between-reversed",
    ),
    pytest.param(
        job('once = "2031-01-01 00:00"\n' + TASK),
        "job 'j': once: 2031-01-01T00:00:00 has no UTC offset",
        id="once-without-offset",
    ),
    pytest.param(
        job("once = []\n" + TASK),
        "job 'j': once: needs at least one date-time",
        id="once-empty",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "env = { A = 1 }\n"),
        "job 'j': env: must be a table of strings, such as { LANG = \"C.UTF-8\" }",
        id="env-not-strings",
    ),
    pytest.param(
        job('every = "1m"\n' + TASK + "tags = [1]\n"),
        "tags: must be a string or a list of strings, not [1]",
        id="tags-not-strings",
    ),
    pytest.param(
        job('cron = "* * * * *"\nseconds = "yes"\n' + TASK),
        "seconds: must be true or false, not 'yes'",
        id="seconds-not-a-boolean",
    ),
    pytest.param(
        '[job]\nname = "j"\nevery = "1m"\n' + TASK,
        "jobs are written [[job]] (an array of tables), not [job]",
        id="job-not-an-array",
    ),
    pytest.param("job = [1]\n", "job #1 must be a table", id="job-not-a-table"),
    pytest.param(
        '[scheduler]\ndatabase_url = "postgresql://db/jobs"\nnamespace = "billing\\n"\n',
        "[scheduler]: namespace: 'billing\\n' contains control characters",
        id="namespace-with-a-newline",
    ),
    pytest.param(
        '[scheduler]\nreplica_id = "web\\u001b[2J"\n',
        "[scheduler]: replica_id: 'web\\x1b[2J' contains control characters",
        id="replica-id-with-an-escape",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_a_bad_config_gives_one_line_naming_the_problem(
    text: str, expected: str, workdir: Path
) -> None:
    problems = problems_of(text, workdir)
    assert len(problems) == 1, problems
    assert_one_line_each(problems, workdir)
    assert expected.replace("@TMP@", str(workdir)) in problems[0]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"REPLICRON_MAX_WORKERS": "seven"},
            "REPLICRON_MAX_WORKERS (environment): must be a whole number of at least 1, "
            "not 'seven'",
        ),
        ({"REPLICRON_STOP_TIMEOUT": "soon"}, "REPLICRON_STOP_TIMEOUT (environment): 'soon'"),
        ({"REPLICRON_TIMEZONE": "Mars/Base"}, "unknown time zone 'Mars/Base'"),
        ({"REPLICRON_HTTP": "host:port"}, "REPLICRON_HTTP (environment): 'host:port' needs"),
        ({"REPLICRON_LOG_FORMAT": "xml"}, "REPLICRON_LOG_FORMAT (environment): must be one"),
        (
            {"REPLICRON_DATABASE_URL": "postgresql://u@h/d", "REPLICRON_STATE_DIR": "/s"},
            "set database_url (PostgreSQL) or state_dir (embedded), not both",
        ),
    ],
    ids=["max-workers", "stop-timeout", "timezone", "http", "log-format", "both-backends"],
)
def test_a_bad_setting_from_the_environment_is_one_line(
    environ: dict[str, str], expected: str, tmp_path: Path
) -> None:
    problems = problems_of(job('every = "1m"\n' + TASK), tmp_path, environ)
    assert len(problems) == 1, problems
    assert_one_line_each(problems, tmp_path)
    assert expected in problems[0]


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    text = (
        '[schedulr]\n\n[scheduler]\nmax_worker = 4\nhttp = "localhost:0"\n'
        'stop_timeout = "soon"\n\n'
        '[[job]]\nevery = "1m"\ncommand = ["true"]\n\n'
        + job('every = "1m"\ncommand = "echo hi"\novrlap = "skip"\n', "a")
        + job('cron = "* * * * *"\ncall = "m:f"\ncommand = ["true"]\nmax_runs = 0\n', "b")
        + job('every = "1m"\n' + TASK + 'timeout = "0s"\nenv = { X = "${UNSET}" }\n', "c")
        + job('every = "1m"\n' + TASK, "c")
        + job('daily = "03:00"\n' + TASK, "fine")
    )
    problems = problems_of(text, tmp_path)
    expected = [
        "unknown table ['schedulr']",
        "[scheduler]: unknown setting 'max_worker' (did you mean 'max_workers'?)",
        "[scheduler]: http: 'localhost:0' needs a port",
        "[scheduler]: stop_timeout: 'soon' is not a duration",
        "job #1: needs a name",
        "job 'a': unknown option 'ovrlap' (did you mean 'overlap'?)",
        "job 'a': command: must be a list of arguments such as ['echo', 'hi']",
        "job 'b': needs a command = [...] to run or a call = \"module:function\"; it has both",
        "job 'b': max_runs: must be a whole number of at least 1, not 0",
        "job 'c': timeout: must be longer than 0, not '0s'",
        "job 'c': env: ${UNSET} is not set in the environment",
        "job 'c': a second job has the same name",  # the first's problems do not hide it
    ]
    assert_each_once(problems, expected, tmp_path)


def test_every_job_the_library_refuses_is_reported_at_once(workdir: Path) -> None:
    text = (
        job('cron = "60 * * * *"\n' + TASK, "cron")
        + job('cron = "0 * * * *"\ntz = "Mars/Base"\n' + TASK, "zone")
        + job('every = "1m"\ncommand = ["replicron-no-such-program"]\n', "program")
        + job('every = "1m"\ncall = "replicron_no_such_module:f"\n', "module")
        + job('every = "1m"\ncall = "math:sqrt"\n', "arguments")
        + job('weekly = "funday"\n' + TASK, "weekly")
        + job('every = "1m"\n' + TASK, "fine")
    )
    problems = problems_of(text, workdir)
    assert_one_line_each(problems, workdir)
    names = ["cron", "zone", "program", "module", "arguments", "weekly"]
    assert len(problems) == len(names), problems
    for name, line in zip(names, problems, strict=True):
        assert line.startswith(f"{config_path(workdir)}: job {name!r}: "), line


def test_each_problem_of_a_job_or_section_is_reported_whatever_the_others(
    workdir: Path,
) -> None:
    text = (
        '[scheduler]\ntimezone = "Mars/Base"\n\n'
        + job(
            'weekly = "funday"\novrlap = "skip"\novershoot = 1\noverlap = "sometimes"\n' + TASK,
            "weekly",
        )
        + job(
            'cron = "61 * * * *"\ntz = "Nowhere/Land"\ncommand = ["replicron-no-such-program"]\n',
            "cron",
        )
        + '[[job]]\ncommand = ["true"]\n\n'
        + job('cron = "0 * * * *"\ntz = "Nowhere/Land"\n' + TASK, "zone")
    )
    problems = problems_of(text, workdir)
    expected = [
        "[scheduler]: unknown time zone 'Mars/Base'",
        "job 'weekly': unknown option 'ovrlap'",
        "job 'weekly': unknown option 'overshoot'",
        "job 'weekly': overlap: must be one of 'skip', 'queue', 'allow', not 'sometimes'",
        "job 'weekly': weekly: unknown weekday 'funday'",
        "job 'cron': tz: unknown time zone 'Nowhere/Land'",
        "job 'cron': cron: '61' is out of range 0-59 in the minute field",
        "job 'cron': command: 'replicron-no-such-program' is not found on PATH",
        "job #3: needs a name",
        "job #3: needs exactly one of cron, every",
        "job 'zone': tz: unknown time zone 'Nowhere/Land'",
    ]
    assert_each_once(problems, expected, workdir)


def test_a_valid_config_has_no_problems(workdir: Path) -> None:
    text = (
        '[scheduler]\ntimezone = "Europe/Paris"\nstate_dir = "@TMP@/state"\n'
        'stop_timeout = "0s"\nhttp = ":9464"\nlog_level = "debug"\n'
        + job('cron = "*/5 * * * *"\ncommand = ["true"]\ncwd = "@TMP@"\n', "a")
        + job('every = "1m"\ncommand = "exit 0"\nshell = true\n', "b")
        + job(
            'every = "1m"\ncall = "textwrap:indent"\nargs = ["x"]\nkwargs = { prefix = "> " }\n',
            "c",
        )
    )
    assert problems_of(text, workdir) == []
    assert not (workdir / "state").exists()  # checking opens no backend


# ---- what the values mean --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ('"90s"', 90),
        ('"10m"', 600),
        ('"2h"', 7200),
        ('"1d"', 86400),
        ('"500ms"', 0.5),
        ('"1h30m"', 5400),
        ('"1d2h3m4s"', 86400 + 7200 + 180 + 4),
        ('"1.5h"', 5400),
        ('" 45s "', 45),
        ("45", 45),
        ("2.5", 2.5),
    ],
)
def test_durations(written: str, seconds: float) -> None:
    parsed_job = one_job(job(f"every = {written}\n" + TASK + f"timeout = {written}\n"))
    assert parsed_job.timeout == timedelta(seconds=seconds)
    # "every" ticks at the Unix epoch plus whole multiples of its duration.
    trigger = make_trigger(parsed_job)
    assert list(upcoming(trigger, EPOCH, 3)) == [
        EPOCH + timedelta(seconds=seconds * k) for k in (1, 2, 3)
    ]


def test_zero_is_a_duration_only_where_it_means_something() -> None:
    config = parsed('[scheduler]\nstop_timeout = "0s"\n' + job('every = "1m"\n' + TASK))
    assert config.scheduler.stop_timeout == timedelta(0)
    assert one_job(job('every = "1m"\n' + TASK + "kill_grace = 0\n")).kill_grace == timedelta(0)


def test_variables_are_expanded_from_the_given_environment() -> None:
    environ = {"WHO": "world", "EMPTY": "", "SCHEDULE": "*/7 * * * *", "DIR": "/srv/x"}
    parsed_job = one_job(
        job(
            'cron = "${SCHEDULE}"\n'
            'command = ["echo", "hello ${WHO}", "${MISSING:-fallback}", "${EMPTY:-blank}",'
            ' "[${EMPTY}]", "$${WHO}", "100$$", "$WHO"]\n'
            'cwd = "${DIR:-/tmp}"\nenv = { GREETING = "hi ${WHO}" }\ntags = ["${WHO}"]\n'
        ),
        environ,
    )
    assert parsed_job.schedule == "*/7 * * * *"
    assert parsed_job.command == (
        "echo",
        "hello world",
        "fallback",
        "blank",
        "[]",
        "${WHO}",
        "100$",
        "$WHO",
    )
    assert parsed_job.cwd == "/srv/x"
    assert parsed_job.env == (("GREETING", "hi world"),)
    assert parsed_job.tags == ("world",)


def test_variables_in_call_arguments_and_scheduler_settings() -> None:
    environ = {"N": "3", "STATE": "/var/lib/x", "NS": "prod"}
    config = parsed(
        '[scheduler]\nstate_dir = "${STATE}"\nnamespace = "${NS}-${REGION:-eu}"\n'
        + job('every = "1m"\ncall = "m:f"\nargs = ["${N}", ["${N}"]]\nkwargs = { k = "${N}" }\n'),
        environ,
    )
    assert config.scheduler.state_dir == "/var/lib/x"
    assert config.scheduler.namespace == "prod-eu"
    assert config.jobs[0].args == ("3", ["3"])
    assert config.jobs[0].kwargs == (("k", "3"),)


def test_a_shell_command_is_left_for_the_shell_to_expand() -> None:
    script = 'echo "${NOT_SET_HERE}" $$ ${HOME:-x} && exit 0'
    environ = {"HOME": "/home/someone", "WHO": "world"}
    parsed_job = one_job(
        job(
            f"every = \"1m\"\ncommand = '{script}'\nshell = true\n"
            'env = { GREETING = "hi ${WHO}" }\n'
        ),
        environ,
    )
    assert parsed_job.command == (script,)
    assert parsed_job.shell is True
    assert parsed_job.env == (("GREETING", "hi world"),)  # the env table is still expanded


def test_shell_false_expands_the_same_string_list() -> None:
    parsed_job = one_job(
        job('every = "1m"\ncommand = ["sh", "-c", "${SCRIPT}"]\nshell = false\n'),
        {"SCRIPT": "exit 3"},
    )
    assert parsed_job.command == ("sh", "-c", "exit 3")


def test_environment_settings_override_the_file() -> None:
    text = (
        '[scheduler]\nstate_dir = "/from/file"\nstop_timeout = "5s"\nmax_workers = 3\n'
        'log_level = "ERROR"\nnamespace = "file"\n'
    )
    environ = {
        "REPLICRON_STOP_TIMEOUT": "45s",
        "REPLICRON_DATABASE_URL": "postgresql://u@db.example/jobs",
        "REPLICRON_MAX_WORKERS": "7",
        "REPLICRON_LOG_LEVEL": "debug",
        "REPLICRON_HTTP": ":9464",
        "REPLICRON_NAMESPACE": "",  # empty: not given, the file's stays
        "REPLICRON_MIGRATE": "false",
        "REPLICRON_HEARTBEAT_INTERVAL": "2",  # seconds, as a number would be in the file
        "REPLICRON_SESSION_POOLER": "1",
    }
    settings = parsed(text, environ).scheduler
    assert settings.stop_timeout == timedelta(seconds=45)
    assert settings.database_url == "postgresql://u@db.example/jobs"
    assert settings.state_dir is None  # the environment's backend replaces the file's
    assert settings.backend_kind == "postgres"
    assert settings.max_workers == 7
    assert settings.log_level == "DEBUG"
    assert settings.http == ("127.0.0.1", 9464)
    assert settings.namespace == "file"
    assert (settings.migrate, settings.session_pooler) == (False, True)
    assert settings.heartbeat_interval == timedelta(seconds=2)
    # Without the environment, the file's values.
    settings = parsed(text).scheduler
    assert (settings.state_dir, settings.database_url) == ("/from/file", None)
    assert (settings.stop_timeout, settings.max_workers) == (timedelta(seconds=5), 3)
    assert settings.backend_kind == "embedded"
    assert (settings.migrate, settings.session_pooler) == (True, False)
    assert settings.coordination == "advisory"


def test_replicron_coordination_picks_lease_mode_for_the_backend() -> None:
    text = '[scheduler]\ndatabase_url = "postgresql://u@db.example/jobs"\n'
    settings = parsed(text, {"REPLICRON_COORDINATION": " Lease"}).scheduler
    assert settings.coordination == "lease"
    backend = make_backend(settings)  # connects only when the scheduler opens it
    assert isinstance(backend, PostgresBackend)
    assert backend.coordination == "lease"
    default = make_backend(parsed(text).scheduler)
    assert isinstance(default, PostgresBackend)
    assert default.coordination == "advisory"


def test_replicron_state_dir_replaces_the_files_database_url() -> None:
    settings = parsed(
        '[scheduler]\ndatabase_url = "postgresql://u@h/d"\n', {"REPLICRON_STATE_DIR": "/st"}
    ).scheduler
    assert (settings.state_dir, settings.database_url) == ("/st", None)
    assert settings.backend_kind == "embedded"


def test_an_environment_setting_is_taken_as_it_is() -> None:
    url = "postgresql://u:pa$$wo${rd@db.example/jobs"
    settings = parsed("", {"REPLICRON_DATABASE_URL": url}).scheduler
    assert settings.database_url == url


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ('"127.0.0.1:9464"', ("127.0.0.1", 9464)),
        ('"0.0.0.0:80"', ("0.0.0.0", 80)),
        ('"[::1]:9464"', ("::1", 9464)),
        ('":9464"', ("127.0.0.1", 9464)),
        ('"9464"', ("127.0.0.1", 9464)),
        ("9464", ("127.0.0.1", 9464)),
    ],
)
def test_http_addresses(written: str, expected: tuple[str, int]) -> None:
    assert parsed(f"[scheduler]\nhttp = {written}\n").scheduler.http == expected


def test_defaults() -> None:
    config = parsed(job('every = "1m"\n' + TASK))
    settings = config.scheduler
    assert (settings.timezone, settings.state_dir, settings.database_url) == ("UTC", None, None)
    assert settings.backend_kind == "embedded"
    parsed_job = config.jobs[0]
    assert (parsed_job.overlap, parsed_job.catch_up, parsed_job.shell) == ("skip", "latest", False)
    assert parsed_job.command == ("true",)
    assert parsed_job.timeout is None


# ---- the config as the daemon keeps it -------------------------------------------------------


def every_field_set() -> DaemonConfig:
    """A config whose every field (and every scheduler setting) holds a value of its own, so
    that a step which rebuilds the config and forgets a field, present or future, is seen."""

    def filled(kind: type[Any], **given: object) -> Any:
        return kind(**{f.name: given.get(f.name, object()) for f in dataclasses.fields(kind)})

    return filled(DaemonConfig, scheduler=filled(SchedulerConfig))  # type: ignore[no-any-return]


def assert_same_but(made: object, original: object, changed: dict[str, object]) -> None:
    for field in dataclasses.fields(original):  # type: ignore[arg-type]
        expected = changed.get(field.name, getattr(original, field.name))
        assert getattr(made, field.name) is expected, field.name


def test_the_replica_id_the_daemon_makes_up_keeps_every_other_setting() -> None:
    config = every_field_set()
    made = with_replica_id(config, "host:42")
    assert_same_but(made, config, {"scheduler": made.scheduler})
    assert_same_but(made.scheduler, config.scheduler, {"replica_id": "host:42"})


def test_a_reload_keeps_the_restart_only_settings_and_takes_every_other_field() -> None:
    running, reloaded = every_field_set(), every_field_set()
    restart_only = ("timezone", "replica_id")
    applied = restarted_settings_kept(running, reloaded, restart_only)
    assert_same_but(applied, reloaded, {"scheduler": applied.scheduler})
    kept = {key: getattr(running.scheduler, key) for key in restart_only}
    assert_same_but(applied.scheduler, reloaded.scheduler, kept)


# ---- every kind of trigger builds --------------------------------------------------------------

AFTER = datetime(2030, 1, 1, 0, 0, 5, tzinfo=UTC)  # a Tuesday


def built(text: str) -> tuple[JobConfig, Iterator[datetime]]:
    """The job of ``text``, checked by the library, and its trigger's ticks after AFTER."""
    config = parsed(text)
    assert asyncio.run(validate(config)) == []
    parsed_job = config.jobs[0]
    return parsed_job, upcoming(make_trigger(parsed_job), AFTER, 4)


def test_cron_with_seconds() -> None:
    _, ticks = built(job('cron = "*/20 * * * * *"\nseconds = true\n' + TASK))
    start = AFTER.replace(second=0)
    assert list(ticks) == [start + timedelta(seconds=s) for s in (20, 40, 60, 80)]


def test_cron_in_a_zone() -> None:
    _, ticks = built(job('cron = "30 9 * * *"\ntz = "America/New_York"\n' + TASK))
    zone = ZoneInfo("America/New_York")
    assert list(ticks) == [
        datetime(2030, 1, d, 9, 30, tzinfo=zone).astimezone(UTC) for d in (1, 2, 3, 4)
    ]


def test_every_with_jitter() -> None:
    config = parsed(job('every = "1h"\njitter = "5m"\n' + TASK))
    assert asyncio.run(validate(config)) == []
    assert config.jobs[0].jitter == timedelta(minutes=5)
    start = datetime(2030, 1, 1, 0, 30, tzinfo=UTC)  # past the 00:00 tick and its jitter
    ticks = upcoming(make_trigger(config.jobs[0]), start, 4)
    hours = [datetime(2030, 1, 1, h, tzinfo=UTC) for h in (1, 2, 3, 4)]
    for tick, hour in zip(ticks, hours, strict=True):
        assert hour <= tick < hour + timedelta(minutes=5)


def test_between() -> None:
    _, ticks = built(job('between = ["1m", "5m"]\n' + TASK))
    found = [AFTER, *ticks]
    assert len(found) == 5
    for earlier, later in itertools.pairwise(found[1:]):
        assert timedelta(minutes=1) <= later - earlier <= timedelta(minutes=5)


def test_daily_in_a_zone() -> None:
    _, ticks = built(job('daily = ["03:00", "15:30"]\ntz = "Europe/Paris"\n' + TASK))
    paris = ZoneInfo("Europe/Paris")
    expected = [
        datetime.combine(date(2030, 1, d), t, paris).astimezone(UTC)
        for d in (1, 2)
        for t in (time(3), time(15, 30))
    ]
    assert list(ticks) == expected


def test_weekly() -> None:
    _, ticks = built(job('weekly = ["mon", "friday"]\nat = "09:30"\n' + TASK))
    days = [AFTER.date() + timedelta(days=n) for n in range(15)]
    times = [datetime.combine(d, time(9, 30), UTC) for d in days if d.weekday() in (0, 4)]
    assert list(ticks) == [t for t in times if t > AFTER][:4]


def test_monthly_from_the_end() -> None:
    _, ticks = built(job('monthly = [1, -1]\nat = ["06:00"]\n' + TASK))
    assert list(ticks) == [
        datetime(2030, m, d, 6, tzinfo=UTC) for m, d in ((1, 1), (1, 31), (2, 1), (2, 28))
    ]


def test_once_in_the_future_and_in_the_past() -> None:
    _, ticks = built(job('once = [2001-01-01T00:00:00Z, "2099-01-01T12:00:00+02:00"]\n' + TASK))
    assert list(ticks) == [datetime(2099, 1, 1, 10, tzinfo=UTC)]
    past_only = one_job(job("once = 2001-01-01T00:00:00Z\n" + TASK))
    # The trigger itself builds with a past instant (a daemon restarting after it ran).
    assert list(upcoming(make_trigger(past_only), EPOCH, 2)) == [datetime(2001, 1, 1, tzinfo=UTC)]


def test_the_scheduler_zone_is_the_default_of_every_job() -> None:
    config = parsed('[scheduler]\ntimezone = "Asia/Tokyo"\n' + job('daily = "09:00"\n' + TASK))
    before = datetime.now(UTC)
    problems, runs = asyncio.run(preview(config, 2))
    after = datetime.now(UTC)
    assert problems == []

    def expected(now: datetime) -> list[datetime]:  # 09:00 in Tokyo (UTC+9) is 00:00 UTC
        first = datetime.combine(now.date() + timedelta(days=1), time(0), UTC)
        return [first, first + timedelta(days=1)]

    assert runs["j"] in (expected(before), expected(after))


# ---- check_config: `replicron check` as a function -------------------------------------------


def test_check_config_of_a_valid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLICRON_TIMEZONE", "Asia/Tokyo")
    monkeypatch.setenv("WHO", "world")
    path = tmp_path / "jobs.toml"
    path.write_text(
        f'[scheduler]\nstate_dir = "{tmp_path / "state"}"\n'
        + job('daily = "09:00"\ncommand = ["echo", "${WHO}"]\n', "morning")
    )
    out = io.StringIO()
    before = datetime.now(UTC)
    assert check_config(str(path), count=2, out=out) == 0
    after = datetime.now(UTC)
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        f"{path}: 1 jobs on embedded (state in {tmp_path / 'state'}), time zone Asia/Tokyo"
    )
    assert lines[1] == "  morning: daily = '09:00'; runs echo world"

    def shown(now: datetime) -> list[str]:  # 09:00 in Tokyo, shown with its +09:00
        first = datetime.combine(now.date() + timedelta(days=1), time(9), ZoneInfo("Asia/Tokyo"))
        return [f"    {(first + timedelta(days=k)).isoformat()}" for k in (0, 1)]

    assert lines[2:4] in (shown(before), shown(after))
    assert lines[4:] == [f"OK: {path} is valid"]
    assert not (tmp_path / "state").exists()


def test_check_config_of_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(
        job('cron = "60 * * * *"\n' + TASK, "a") + job('every = "1m"\ncall = "os:nope"\n', "b")
    )
    out = io.StringIO()
    assert check_config(str(path), out=out) == 2
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert_one_line_each(lines, tmp_path)
    assert "job 'a': cron: '60' is out of range" in lines[0]
    assert "job 'b': call: module 'os' has no 'nope'" in lines[1]


def test_check_config_of_a_missing_file(tmp_path: Path) -> None:
    out = io.StringIO()
    assert check_config(str(tmp_path / "jobs.toml"), out=out) == 2
    assert (
        out.getvalue() == f"{tmp_path / 'jobs.toml'}: cannot read it: No such file or directory\n"
    )


# ---- bugs, written as the behaviour they should have ---------------------------------------


def test_a_negative_duration_string_says_it_must_be_positive(tmp_path: Path) -> None:
    problems = problems_of(job('every = "-5s"\n' + TASK), tmp_path)
    assert len(problems) == 1
    assert "every: must be longer than 0, not '-5s'" in problems[0]


def test_an_unclosed_reference_is_a_problem(tmp_path: Path) -> None:
    problems = problems_of(job('every = "1m"\ncommand = ["echo", "${NAME"]\n'), tmp_path)
    assert len(problems) == 1
    assert "${NAME" in problems[0]


def test_a_one_time_job_in_the_past_does_not_stop_the_daemon(tmp_path: Path) -> None:
    text = job("once = 2001-01-01T00:00:00Z\n" + TASK, "done") + job('every = "1m"\n' + TASK)
    assert problems_of(text, tmp_path) == []


@pytest.mark.parametrize(
    ("body", "option"),
    [
        ('cron = "* * * * *"\njitter = "5s"\n', "jitter"),
        ('every = "1m"\nat = "03:00"\n', "at"),
        ('daily = "03:00"\nat = "04:00"\n', "at"),
        ('daily = "03:00"\nseconds = true\n', "seconds"),
        ('every = "1m"\ntz = "Europe/Paris"\n', "tz"),
        ('every = "1m"\ntz = "Nowhere/Land"\n', "tz"),  # one line: the zone is not read
    ],
    ids=[
        "jitter-on-cron",
        "at-on-every",
        "at-on-daily",
        "seconds-on-daily",
        "tz-on-every",
        "unknown-tz-on-every",
    ],
)
def test_an_option_the_trigger_does_not_use_is_a_problem(
    body: str, option: str, tmp_path: Path
) -> None:
    problems = problems_of(job(body + TASK), tmp_path)
    assert len(problems) == 1
    assert f"job 'j': {option}: " in problems[0]


def test_stale_after_must_be_longer_than_the_heartbeat(tmp_path: Path) -> None:
    text = (
        '[scheduler]\ndatabase_url = "postgresql://u@127.0.0.1:1/d"\n'
        'heartbeat_interval = "10s"\nstale_after = "5s"\n'
    )
    problems = problems_of(text, tmp_path)
    assert len(problems) == 1
    assert "stale_after" in problems[0]
    assert "heartbeat_interval" in problems[0]


def test_an_import_error_is_one_line(tmp_path: Path) -> None:
    module = f"replicron_test_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text('raise RuntimeError("first\\nsecond")\n')
    problems = problems_of(job(f'every = "1m"\ncall = "{module}:f"\n'), tmp_path)
    assert len(problems) == 1
    assert_one_line_each(problems, tmp_path)
    assert f"call: importing {module!r} raised RuntimeError: first second" in problems[0]


def test_the_parsers_and_the_librarys_problems_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(
        job('every = "1m"\n' + TASK + 'timout = "1s"\n', "typo")
        + job('cron = "60 * * * *"\n' + TASK, "cron")
    )
    out = io.StringIO()
    assert check_config(str(path), out=out) == 2
    problems = out.getvalue().splitlines()
    assert len(problems) == 2, problems
    assert "job 'typo': unknown option 'timout'" in problems[0]
    assert "job 'cron': cron: '60' is out of range" in problems[1]


def test_a_shell_that_is_not_a_boolean_is_one_problem(tmp_path: Path) -> None:
    problems = problems_of(job('every = "1m"\ncommand = ["echo", "hi"]\nshell = "yes"\n'), tmp_path)
    assert len(problems) == 1, problems
    assert "shell: must be true or false, not 'yes'" in problems[0]


def test_values_nested_too_deeply_are_one_problem(tmp_path: Path) -> None:
    config = tmp_path / "deep.toml"
    config.write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError) as raised:
        load_config(config, {})
    assert raised.value.problems == [f"{config}: values nested too deeply"]


def test_leader_mode_is_set_for_the_scheduler_and_per_job() -> None:
    text = (
        '[scheduler]\nstate_dir = "/st"\nleader = true\n'
        '[[job]]\nname = "led"\nevery = "1m"\ncommand = ["true"]\n'
        '[[job]]\nname = "free"\nevery = "1m"\ncommand = ["true"]\nleader = false\n'
    )
    config = parsed(text)
    assert config.scheduler.leader is True
    assert [(job.name, job.leader) for job in config.jobs] == [("led", None), ("free", False)]
    scheduler = make_scheduler(config.scheduler, None)
    for job in config.jobs:
        scheduler.add_job(make_trigger(job), lambda: None, **options_of(job))
    assert [job.spec.leader for job in scheduler.jobs()] == [None, False]
    assert parsed('[scheduler]\nstate_dir = "/st"\n').scheduler.leader is False
    assert parsed(text, {"REPLICRON_LEADER": "no"}).scheduler.leader is False


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[scheduler]\nleader = "sometimes"\n', "leader: must be true or false, not 'sometimes'"),
        (
            '[[job]]\nname = "j"\nevery = "1m"\ncommand = ["true"]\nleader = "yes"\n',
            "job 'j': leader: must be true or false, not 'yes'",
        ),
    ],
)
def test_leader_mode_must_be_true_or_false(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parsed(text)
    assert any(problem in line for line in caught.value.problems), caught.value.problems


# ---- fixed delay: after = "2s" -------------------------------------------------------------


def test_after_is_a_fixed_delay_job(tmp_path: Path) -> None:
    trigger = make_trigger(one_job(job('after = "1m30s"\n' + TASK)))
    assert trigger == after(seconds=90)
    assert problems_of(job('after = "2s"\n' + TASK), tmp_path) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('after = "0s"\n', "job 'j': after: "),
        ('after = "-2s"\n', "job 'j': after: must be longer than 0"),
        ('after = "soon"\n', "job 'j': after: 'soon' is not a duration"),
        ('after = "2s"\njitter = "1s"\n', "job 'j': jitter: applies to every jobs, not to after"),
        ('after = "2s"\nevery = "1m"\n', "job 'j': needs exactly one of"),
    ],
    ids=["zero", "negative", "not-a-duration", "jitter", "two-triggers"],
)
def test_a_bad_fixed_delay_is_a_problem_at_load(body: str, expected: str, tmp_path: Path) -> None:
    problems = problems_of(job(body + TASK), tmp_path)
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_check_shows_a_fixed_delay_jobs_first_tick_and_what_follows(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(
        f'[scheduler]\nstate_dir = "{tmp_path / "state"}"\n' + job('after = "30s"\n' + TASK)
    )
    out = io.StringIO()
    assert check_config(str(path), count=3, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[1] == "  j: after = '30s'; runs true"
    assert datetime.fromisoformat(lines[2].strip()).second in (0, 30)  # every(30 s)'s first
    assert lines[3] == "    (if none is recorded yet; then 30s after each finish)"
    assert lines[4:] == [f"OK: {path} is valid"]
