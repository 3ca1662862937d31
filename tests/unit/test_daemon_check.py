"""`replicron check CONFIG` and `replicron run CONFIG` on a bad config, as real processes: the
next fire times of a valid config, and exit status 2 with one line per problem (never a
traceback) for a bad one. No daemon is started: `run` is only given configs it refuses."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.helpers import REPO

PARIS = ZoneInfo("Europe/Paris")


def replicron(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``replicron ARGS`` as a real process from the repository root (as tests.helpers.run_cli
    does), with no REPLICRON_* setting but those of ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REPLICRON_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "replicron", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write(tmp_path: Path, text: str, name: str = "jobs.toml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("@TMP@", str(tmp_path)))
    return path


def assert_problems(
    result: subprocess.CompletedProcess[str], path: Path, fragments: list[str], stream: str
) -> None:
    """Exit status 2 and, on ``stream``, exactly one line per fragment (in that order), each
    naming the config; nothing on the other stream, and no traceback anywhere."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    shown, other = (
        (result.stdout, result.stderr) if stream == "stdout" else (result.stderr, result.stdout)
    )
    assert other == ""
    lines = shown.splitlines()
    assert len(lines) == len(fragments), lines
    for line, fragment in zip(lines, fragments, strict=True):
        assert line.startswith(f"{path}: "), line
        assert fragment in line, (fragment, line)


# ---- the next fire times of a valid config ---------------------------------------------------


def hourly(now: datetime, count: int) -> list[datetime]:
    """every = "1h": whole hours of the Unix epoch after ``now``."""
    first = (math.floor(now.timestamp() / 3600) + 1) * 3600
    return [datetime.fromtimestamp(first + 3600 * k, UTC) for k in range(count)]


def quarter_hours(now: datetime, count: int) -> list[datetime]:
    """cron = "*/15 * * * *" in Paris (whole-hour offsets: the same instants as in UTC)."""
    first = (math.floor(now.timestamp() / 900) + 1) * 900
    return [datetime.fromtimestamp(first + 900 * k, UTC) for k in range(count)]


def paris_at_three(now: datetime, count: int) -> list[datetime]:
    """daily = "03:00" in Paris."""
    day = now.astimezone(PARIS).date()
    found: list[datetime] = []
    while len(found) < count:
        candidate = datetime.combine(day, time(3), PARIS)
        if candidate > now:
            found.append(candidate)
        day += timedelta(days=1)
    return found


def shown_in_paris(instants: list[datetime]) -> list[str]:
    return [f"    {i.astimezone(PARIS).isoformat()}" for i in instants]


Expected = Callable[[datetime, int], list[datetime]]


def assert_fire_times(
    lines: list[str], job: str, expected: Expected, before: datetime, after: datetime, n: int
) -> None:
    """The ``n`` lines after the job's line are its next fire times as of some moment
    between ``before`` and ``after`` (the check ran in between)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {job}: "))
    shown = lines[start + 1 : start + 1 + n]
    assert shown in (shown_in_paris(expected(before, n)), shown_in_paris(expected(after, n)))


VALID = """\
[scheduler]
timezone = "Europe/Paris"
state_dir = "@TMP@/state"

[[job]]
name = "hourly"
every = "1h"
command = ["echo", "${GREETING:-hello}"]

[[job]]
name = "nightly"
daily = "03:00"
command = "echo $HOME"
shell = true

[[job]]
name = "quarter"
cron = "*/15 * * * *"
call = "os.path:join"
args = ["a", "b"]
"""


def test_check_prints_the_next_three_fire_times(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    before = datetime.now(UTC)
    result = replicron("check", str(path))
    after = datetime.now(UTC)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"{path}: 3 jobs on embedded (state in {tmp_path / 'state'}), time zone Europe/Paris"
    )
    assert lines[1] == "  hourly: every = '1h'; runs echo hello"
    assert lines[5] == "  nightly: daily = '03:00'; runs 'echo $HOME'"
    assert lines[9] == "  quarter: cron = '*/15 * * * *'; runs call os.path:join"
    assert_fire_times(lines, "hourly", hourly, before, after, 3)
    assert_fire_times(lines, "nightly", paris_at_three, before, after, 3)
    assert_fire_times(lines, "quarter", quarter_hours, before, after, 3)
    assert lines[13:] == [f"OK: {path} is valid"]
    assert not (tmp_path / "state").exists()  # checking opens no backend


def test_check_prints_a_jobs_fire_times_in_its_own_zone(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[scheduler]\nstate_dir = "@TMP@/state"\n\n[[job]]\nname = "berlin"\n'
        'cron = "0 3 * * *"\ntz = "Europe/Berlin"\ncommand = ["true"]\n',
    )
    result = replicron("check", str(path), "-n", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("time zone UTC")
    # 03:00 in Berlin, whatever the scheduler's zone: +01:00 in winter, +02:00 in summer.
    assert lines[2].startswith("    ")
    assert lines[2].endswith(("T03:00:00+01:00", "T03:00:00+02:00"))


def test_check_n_prints_that_many_fire_times(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    before = datetime.now(UTC)
    result = replicron("check", str(path), "-n", "5")
    after = datetime.now(UTC)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + 3 * (1 + 5) + 1
    assert_fire_times(lines, "hourly", hourly, before, after, 5)
    assert_fire_times(lines, "nightly", paris_at_three, before, after, 5)
    assert_fire_times(lines, "quarter", quarter_hours, before, after, 5)


@pytest.mark.parametrize("n", ["0", "-1"])
def test_check_n_below_one_is_refused(n: str, tmp_path: Path) -> None:
    result = replicron("check", str(write(tmp_path, VALID)), "-n", n)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"replicron: error: -n must be at least 1, got {n}\n"


def test_check_uses_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    result = replicron("check", str(path), env={"GREETING": "bonjour"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  hourly: every = '1h'; runs echo bonjour" in result.stdout.splitlines()


def test_check_with_the_database_url_from_the_environment(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    path = write(tmp_path, VALID)
    url = "postgresql://someone:s3cret@127.0.0.1:1/jobs"
    result = replicron("check", str(path), env={"REPLICRON_DATABASE_URL": url})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == (
        f"{path}: 3 jobs on PostgreSQL (namespace '', advisory coordination), time zone "
        "Europe/Paris"
    )
    assert "s3cret" not in result.stdout + result.stderr


def test_a_one_time_job_shows_its_instants(tmp_path: Path) -> None:
    instant = datetime.now(UTC).replace(microsecond=0) + timedelta(days=400)
    path = write(
        tmp_path,
        f'[[job]]\nname = "once"\nonce = {instant.isoformat()}\ncommand = ["true"]\n',
    )
    result = replicron("check", str(path), "-n", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[2:] == [f"    {instant.isoformat()}", f"OK: {path} is valid"]


# ---- a call target next to the config --------------------------------------------------------

TASKS = """\
def poll(source, *, retries):
    return source, retries
"""


def test_a_call_target_is_imported_from_the_configs_directory(tmp_path: Path) -> None:
    (tmp_path / "replicron_test_tasks.py").write_text(TASKS)
    path = write(
        tmp_path,
        '[[job]]\nname = "poll"\nevery = "10m"\ncall = "replicron_test_tasks:poll"\n'
        'args = ["feed"]\nkwargs = { retries = 3 }\n',
    )
    result = replicron("check", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  poll: every = '10m'; runs call replicron_test_tasks:poll" in result.stdout
    assert result.stdout.splitlines()[-1] == f"OK: {path} is valid"


CALL_TARGET_PROBLEMS = [
    pytest.param(
        {"replicron_test_tasks": TASKS},
        '[[job]]\nname = "poll"\nevery = "10m"\ncall = "replicron_test_tasks:poll"\n'
        'args = ["feed"]\nkwargs = { retry = 3 }\n',
        ["job 'poll': arguments do not fit poll(source, *, retries): "],
        id="arguments-do-not-fit",
    ),
    pytest.param(
        {
            "replicron_test_broken": "import replicron_no_such_module\n",
            "replicron_test_syntax": "def f(:\n",
        },
        '[[job]]\nname = "a"\nevery = "1m"\ncall = "replicron_test_broken:f"\n'
        '[[job]]\nname = "b"\nevery = "1m"\ncall = "replicron_test_syntax:f"\n',
        [
            "job 'a': call: cannot import 'replicron_test_broken': No module named "
            "'replicron_no_such_module'",
            "job 'b': call: importing 'replicron_test_syntax' raised SyntaxError: ",
        ],
        id="module-fails-to-import",
    ),
    pytest.param(
        {"replicron_test_script": "import sys\nsys.exit(0)\ndef main():\n    pass\n"},
        '[[job]]\nname = "s"\nevery = "1m"\ncall = "replicron_test_script:main"\n',
        # A bug, written as the behaviour it should have: an import that exits is one problem.
        ["job 's': call: importing 'replicron_test_script' raised SystemExit"],
        id="module-exits-on-import",
    ),
]


@pytest.mark.parametrize(("modules", "text", "fragments"), CALL_TARGET_PROBLEMS)
def test_a_call_target_that_cannot_be_called(
    modules: dict[str, str], text: str, fragments: list[str], tmp_path: Path
) -> None:
    for module, source in modules.items():
        (tmp_path / f"{module}.py").write_text(source)
    path = write(tmp_path, text)
    assert_problems(replicron("check", str(path)), path, fragments, "stdout")


# ---- bad configs -----------------------------------------------------------------------------

BAD = [
    pytest.param('[scheduler]\ntimezone = "UTC\n', ["not valid TOML: "], id="toml"),
    pytest.param(
        '[[job]]\nname = "a"\nevery = "1m"\ncommand = ["true"]\ntimout = "5s"\n'
        'kill_grace = "10 minutes"\n',
        [
            "job 'a': unknown option 'timout' (did you mean 'timeout'?)",
            "job 'a': kill_grace: '10 minutes' is not a duration",
        ],
        id="parser",
    ),
    pytest.param(
        '[[job]]\nname = "a"\ncron = "60 * * * *"\ncommand = ["true"]\n'
        '[[job]]\nname = "b"\nevery = "1m"\ncommand = ["replicron-no-such-program"]\n'
        '[[job]]\nname = "c"\nevery = "1m"\ncall = "replicron_no_such_module:f"\n'
        '[[job]]\nname = "d"\nweekly = "funday"\ncommand = ["true"]\n',
        [
            "job 'a': cron: '60' is out of range 0-59 in the minute field",
            "job 'b': command: 'replicron-no-such-program' is not found on PATH",
            "job 'c': call: cannot import 'replicron_no_such_module'",
            "job 'd': weekly: unknown weekday 'funday'",
        ],
        id="library",
    ),
    pytest.param(
        '[schedulr]\n[scheduler]\nhttp = "x:0"\n'
        '[[job]]\nevery = "1m"\ncommand = ["true"]\n'
        '[[job]]\nname = "a"\ncommand = "echo ${NOPE}"\n',
        [
            "unknown table ['schedulr'] (did you mean 'scheduler'?)",
            "[scheduler]: http: 'x:0' needs a port from 1 to 65535",
            "job #1: needs a name",
            "job 'a': needs exactly one of cron, every, after, between, daily, weekly, monthly,"
            " once",
            "job 'a': command: ${NOPE} is not set in the environment",
        ],
        id="many",
    ),
    pytest.param(
        '[scheduler]\ntimezone = "Mars/Base"\n',
        ["[scheduler]: unknown time zone 'Mars/Base'"],
        id="timezone",
    ),
    pytest.param(
        '[scheduler]\ntimezone = "Mars/Base"\n'
        '[[job]]\nname = "a"\nweekly = "funday"\noverlap = "sometimes"\ncommand = ["true"]\n'
        '[[job]]\nname = "b"\ncron = "61 * * * *"\ntz = "Nowhere/Land"\ncommand = ["true"]\n'
        '[[job]]\ncommand = ["true"]\n',
        [
            "job 'a': overlap: must be one of 'skip', 'queue', 'allow', not 'sometimes'",
            "job #3: needs a name",
            "job #3: needs exactly one of cron, every, after, between, daily, weekly, monthly",
            "[scheduler]: unknown time zone 'Mars/Base'",
            "job 'a': weekly: unknown weekday 'funday'",
            "job 'b': tz: unknown time zone 'Nowhere/Land'",
            "job 'b': cron: '61' is out of range 0-59 in the minute field",
        ],
        id="each-field",
    ),
]


@pytest.mark.parametrize(("text", "fragments"), BAD)
def test_check_a_bad_config(text: str, fragments: list[str], tmp_path: Path) -> None:
    path = write(tmp_path, text)
    assert_problems(replicron("check", str(path)), path, fragments, "stdout")


@pytest.mark.parametrize(("text", "fragments"), BAD)
def test_run_a_bad_config_starts_nothing(text: str, fragments: list[str], tmp_path: Path) -> None:
    path = write(tmp_path, text)
    state = tmp_path / "state"
    result = replicron("run", str(path), env={"REPLICRON_STATE_DIR": str(state)})
    assert_problems(result, path, fragments, "stderr")
    assert not state.exists()


def test_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"
    for command, stream in (("check", "stdout"), ("run", "stderr")):
        assert_problems(
            replicron(command, str(path)),
            path,
            ["cannot read it: No such file or directory"],
            stream,
        )


def test_a_directory_or_a_binary_file(tmp_path: Path) -> None:
    binary = tmp_path / "jobs.toml"
    binary.write_bytes(b"\xff\xfe[[job]]\n")
    assert_problems(replicron("check", str(binary)), binary, ["cannot read it: "], "stdout")
    assert_problems(
        replicron("check", str(tmp_path)), tmp_path, ["cannot read it: Is a directory"], "stdout"
    )


# ---- bugs, written as the behaviour they should have ---------------------------------------


def test_a_one_time_job_that_ran_has_no_more_fire_times(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[[job]]\nname = "once"\nonce = 2001-01-01T00:00:00Z\ncommand = ["true"]\n'
    )
    result = replicron("check", str(path))
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[2:] == ["    (no more fire times)", f"OK: {path} is valid"]
