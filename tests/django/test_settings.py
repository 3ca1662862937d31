"""``settings.REPLICRON`` checked at startup, each problem naming its key; the embedded
backend for a project on one host whose database is not PostgreSQL; no password in output."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.django.project import Project, database_url, fresh_project
from tests.helpers import poll_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def project() -> Iterator[Project]:
    yield from fresh_project(
        DJANGO_SETTINGS_MODULE="tests.django.override_settings", EXAMPLE_HEARTBEAT_SECONDS="1"
    )


def with_override(project: Project, *args: str, **override: object) -> tuple[int, str]:
    done = project.manage(*args, REPLICRON_OVERRIDE=json.dumps(override))
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ({"coordnation": "lease"}, "settings.REPLICRON['coordnation']: unknown key"),
        ({"coordination": "strict"}, "settings.REPLICRON['coordination']: must be 'advisory'"),
        ({"backend": "embedded"}, "settings.REPLICRON['state_dir']: is required"),
        ({"database": "replica"}, "settings.REPLICRON['database']: 'replica' is not in"),
        ({"timezone": 3}, "settings.REPLICRON['timezone']: must be an IANA zone name"),
        ({"scheduler": {"max_workers": 0}}, "settings.REPLICRON['scheduler']: max_workers"),
        ({"backend_options": {"heartbeat": 1}}, "settings.REPLICRON['backend_options']: "),
        ({"jobs": [{"func": "reports.jobs.nowhere"}]}, "['jobs'][0]['trigger']: a replicron"),
        ({"namespace": "billing\n"}, "settings.REPLICRON['namespace']: 'billing\\n' contains"),
        ({"namespace": "billing\x00"}, "settings.REPLICRON['namespace']: 'billing\\x00' contains"),
    ],
)
def test_a_bad_setting_names_its_key(project: Project, override: object, said: str) -> None:
    assert isinstance(override, dict)
    code, output = with_override(project, "replicron", "check", **override)
    assert code != 0
    assert said in output


def test_a_database_that_is_not_postgresql_is_refused_unless_embedded(
    project: Project, tmp_path: Path
) -> None:
    sqlite = str(tmp_path / "db.sqlite3")
    done = project.manage("replicron", "check", SQLITE_DATABASE=sqlite)
    assert done.returncode != 0
    assert "settings.REPLICRON['database']: DATABASES['default'] is sqlite, not PostgreSQL" in (
        done.stderr
    )
    state_dir = str(tmp_path / "state")
    embedded = json.dumps({"backend": "embedded", "state_dir": state_dir, "backend_options": {}})
    env = {"SQLITE_DATABASE": sqlite, "REPLICRON_OVERRIDE": embedded}
    assert project.manage("migrate", "--noinput", **env).returncode == 0
    replica = project.start("replicron", "run", **env)
    try:
        ran = "SELECT count(*) FROM reports_beat"
        poll_until("a heartbeat", lambda: _count(sqlite, ran) >= 2, 60)
        status = project.manage("replicron", "status", "--json", **env)
        assert status.returncode == 0, status.stderr
        jobs = {job["job"]: job for job in json.loads(status.stdout)["jobs"]}
        assert jobs["heartbeat"]["last_outcome"] == "succeeded"
        asked = project.manage("replicron", "run-now", "nightly-cleanup", **env)
        assert asked.returncode == 0, asked.stderr
        manual = "SELECT outcome FROM replicron_runs WHERE manual = 1 AND outcome IS NOT NULL"
        state = tmp_path / "state" / "replicron.sqlite3"
        poll_until("the run asked for", lambda: _rows(str(state), manual) == [("succeeded",)], 60)
    finally:
        replica.send_signal(signal.SIGTERM)
        _, err = replica.communicate(timeout=60)
    assert replica.returncode == 0, err


def _rows(path: str, query: str) -> list[tuple[Any, ...]]:
    import sqlite3

    conn = sqlite3.connect(path, timeout=10)
    try:
        return conn.execute(query).fetchall()
    except sqlite3.OperationalError:  # not made yet
        return []
    finally:
        conn.close()


def _count(path: str, query: str) -> int:
    rows = _rows(path, query)
    return int(rows[0][0]) if rows else 0


def test_the_password_never_shows(project: Project) -> None:
    url = database_url(project.conninfo).replace("@", ":s3cret-pw@", 1)
    assert ":s3cret-pw@" in url
    unmigrated = project.manage("replicron", "status", DATABASE_URL=url)
    assert unmigrated.returncode != 0
    assert "has no replicron tables: run `manage.py migrate` on it first" in unmigrated.stderr
    assert "s3cret-pw" not in unmigrated.stdout + unmigrated.stderr
    unreachable = url.replace("127.0.0.1", "127.0.0.1", 1).rsplit("/", 1)[0] + "/no_such_db"
    failed = project.manage("replicron", "run", DATABASE_URL=unreachable)
    assert failed.returncode == 1
    assert failed.stderr.startswith("CommandError: cannot start: "), failed.stderr
    assert "no_such_db" in failed.stderr
    assert "s3cret-pw" not in failed.stdout + failed.stderr


def test_the_check_lists_every_problem_of_every_job_at_once(project: Project) -> None:
    jobs = [{"func": 3}, {"func": "reports.jobs.nowhere", "trigger": None}]
    done = project.manage(
        "check",
        EXAMPLE_BROKEN_JOB="1",
        REPLICRON_OVERRIDE=json.dumps({"timezone": "Mars/Base", "jobs": jobs}),
    )
    errors = [line for line in done.stderr.splitlines() if "(replicron.E001)" in line]
    expected = [
        "settings.REPLICRON['timezone']: unknown time zone 'Mars/Base'",
        "settings.REPLICRON['jobs'][0]['func']: a dotted path is required, got 3",
        "settings.REPLICRON['jobs'][0]['trigger']: a replicron trigger is required",
        "settings.REPLICRON['jobs'][1]['func']: cannot import 'reports.jobs.nowhere'",
        "settings.REPLICRON['jobs'][1]['trigger']: a replicron trigger is required",
        "reports.jobs.broken: job 'broken': timeout must be positive, not -1",
    ]
    assert done.returncode == 1, done.stderr
    assert len(errors) == len(expected), done.stderr
    for fragment in expected:
        assert sum(fragment in line for line in errors) == 1, (fragment, done.stderr)
