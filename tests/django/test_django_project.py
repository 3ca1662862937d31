"""The example Django project on a real PostgreSQL: ``manage.py migrate`` makes replicron's
tables, ``manage.py replicron check`` tells a broken job, three ``manage.py replicron run``
processes run each tick once and stop cleanly on SIGTERM, and the admin shows the cluster
and pauses, resumes and runs a job now, as the running replicas observe."""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from tests.django.project import Project, fresh_project
from tests.helpers import poll_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def project() -> Iterator[Project]:
    yield from fresh_project(EXAMPLE_HEARTBEAT_SECONDS="1")


def migrated(project: Project) -> None:
    done = project.manage("migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    assert "Applying replicron.0001_initial... OK" in done.stdout


def test_migrate_makes_replicrons_tables_and_check_tells_a_broken_job(project: Project) -> None:
    migrated(project)
    from replicron.postgres._sql import migrations  # the numbered SQL files, applied as is

    recorded = project.sql("SELECT version, name FROM replicron_migrations ORDER BY 1")
    assert recorded == [(m.version, m.name) for m in migrations()]
    again = project.manage("migrate", "--noinput")
    assert again.returncode == 0, again.stderr
    assert "No migrations to apply" in again.stdout

    ok = project.manage("replicron", "check")
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == "heartbeat: every 1s"
    assert lines[-1] == "OK: 2 jobs, backend postgres"

    broken = project.manage("replicron", "check", EXAMPLE_BROKEN_JOB="1")
    assert broken.returncode == 2
    assert "reports.jobs.broken: job 'broken': timeout must be positive" in broken.stderr
    django_check = project.manage("check", EXAMPLE_BROKEN_JOB="1")
    assert django_check.returncode == 1
    assert "(replicron.E001)" in django_check.stderr


def stop(replicas: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    for replica in replicas:
        replica.send_signal(signal.SIGTERM)
    ended = []
    for replica in replicas:
        _, err = replica.communicate(timeout=60)
        ended.append((replica.returncode, err))
    return ended


def ledger(project: Project) -> list[tuple[str, datetime, str, bool, str]]:
    return project.sql(
        "SELECT job, scheduled_at, outcome, manual, replica_id FROM replicron_runs"
        " WHERE outcome IS NOT NULL ORDER BY scheduled_at"
    )


def rows_after(project: Project, outcome: str, after: datetime, manual: bool = False) -> int:
    [(count,)] = project.sql(
        "SELECT count(*) FROM replicron_runs WHERE job = 'heartbeat' AND outcome = %s"
        " AND manual = %s AND scheduled_at > %s",
        [outcome, manual, after],
    )
    return int(count)


def database_now(project: Project) -> datetime:
    [(now,)] = project.sql("SELECT clock_timestamp()")
    return now  # type: ignore[no-any-return]


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_three_replicas_run_each_tick_once_and_the_admin_steers_them(
    project: Project, coordination: str
) -> None:
    migrated(project)
    created = project.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        "root",
        "--email",
        "root@example.com",
        DJANGO_SUPERUSER_PASSWORD="not-used",
    )
    assert created.returncode == 0, created.stderr
    env = {"REPLICRON_COORDINATION": coordination}
    replicas = [project.start("replicron", "run", **env) for _ in range(3)]
    try:
        started = database_now(project)
        poll_until("five heartbeats", lambda: rows_after(project, "succeeded", started) >= 5, 60)
        [(run_id, replica)] = project.sql(
            "SELECT run_id, replica_id FROM replicron_runs WHERE outcome = 'succeeded' LIMIT 1"
        )
        pages = project.admin("pages", str(run_id), replica)
        for path, page in pages.items():
            assert page["status"] == 200, path
        jobs = pages["/admin/replicron/registeredjob/"]["text"]
        assert "heartbeat" in jobs
        assert "nightly-cleanup" in jobs
        assert "every 1s" in jobs
        assert "Run the selected jobs once now" in jobs
        assert "Add job" not in jobs  # read-only
        assert "succeeded" in pages["/admin/replicron/run/"]["text"]
        assert replica in pages["/admin/replicron/replica/"]["text"]
        assert "heartbeat" in pages[f"/admin/replicron/run/{run_id}/change/"]["text"]

        typo = project.manage("replicron", "pause", "heartbeet")
        assert (typo.returncode, typo.stdout) == (2, "")
        assert typo.stderr == (
            "replicron: error: no replica has registered a job named 'heartbeet' in namespace "
            "'mysite/'; registered jobs: 'heartbeat', 'nightly-cleanup'; to pause a job not "
            "deployed yet, add --force\n"
        )
        forced = project.manage("replicron", "pause", "--force", "deployed-tomorrow")
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout.startswith("paused 'deployed-tomorrow'")
        # The admin acts on the registry's rows only: a name not among them selects nothing.
        assert project.admin("action", "pause", "heartbeet")["messages"] == []
        assert project.sql("SELECT job FROM replicron_paused") == [("deployed-tomorrow",)]

        paused = project.admin("action", "pause", "heartbeat")
        assert paused == {"status": 302, "messages": ["paused 'heartbeat'"]}
        pause_at = database_now(project)
        poll_until("paused ticks", lambda: rows_after(project, "paused", pause_at) >= 2, 60)
        assert (
            "paused"
            in project.admin("pages", str(run_id), replica)["/admin/replicron/registeredjob/"][
                "text"
            ]
        )
        resumed = project.admin("action", "resume", "heartbeat")
        assert resumed == {"status": 302, "messages": ["resumed 'heartbeat'"]}
        resume_at = database_now(project) + timedelta(seconds=1)
        poll_until("runs again", lambda: rows_after(project, "succeeded", resume_at) >= 2, 60)
        assert rows_after(project, "paused", resume_at) == 0

        asked = project.admin("action", "run_now", "heartbeat")
        assert asked["status"] == 302
        assert asked["messages"][0].startswith("asked for a run of 'heartbeat' at ")
        manual = "SELECT outcome FROM replicron_runs WHERE manual AND outcome IS NOT NULL"
        # It runs, unless the job's tick of that second still runs on another replica: then
        # it is recorded skipped_overlap (the job's overlap policy), once all the same.
        assert poll_until("the run asked for", lambda: project.sql(manual) or None, 60) in (
            [("succeeded",)],
            [("skipped_overlap",)],
        )
    finally:
        ended = stop(replicas)
    for code, err in ended:
        assert code == 0, err
        assert "SIGTERM: stopping" in err, err
        assert err.rstrip().endswith("stopped"), err

    rows = ledger(project)
    ticks = Counter((job, at) for job, at, *_ in rows)
    assert [tick for tick, count in ticks.items() if count > 1] == []
    assert sum(1 for *_, manual, _ in rows if manual) == 1
    # Each run wrote one row of its own through the ORM: no tick ran twice.
    beats = Counter(at for (at,) in project.sql("SELECT tick FROM reports_beat"))
    assert [tick for tick, count in beats.items() if count > 1] == []
    ran = [at for job, at, outcome, *_ in rows if job == "heartbeat" and outcome == "succeeded"]
    assert sorted(beats) == sorted(ran)
    # Every second from the first heartbeat to the last has its row: none lost in between.
    scheduled = sorted(at for job, at, _, manual, _ in rows if job == "heartbeat" and not manual)
    span = int((scheduled[-1] - scheduled[0]).total_seconds()) + 1
    assert len(scheduled) == span
    assert len(project.sql("SELECT replica_id FROM replicron_replicas")) == 3
    assert project.sql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ) == [(0,)]


def open_job_connections(project: Project) -> int:
    """Server sessions whose latest statement was the heartbeat job's INSERT."""
    [(count,)] = project.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'idle' AND query LIKE 'INSERT INTO \"reports_beat\"%%'"
    )
    return int(count)


def test_a_job_never_keeps_a_connection_past_its_run(project: Project) -> None:
    """As Django's request cycle does (CONN_MAX_AGE 0 here): each run's connection is closed
    when it ends, so a connection the server or a proxy dropped meanwhile is never reused."""
    migrated(project)
    replica = project.start("replicron", "run")
    try:
        started = database_now(project)
        poll_until("five heartbeats", lambda: rows_after(project, "succeeded", started) >= 5, 60)
        assert open_job_connections(project) == 0
        project.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name NOT LIKE 'replicron%%'"
            " AND pid <> pg_backend_pid()"
        )
        dropped = database_now(project)
        poll_until("three more", lambda: rows_after(project, "succeeded", dropped) >= 3, 60)
        assert rows_after(project, "failed", started) == 0
    finally:
        replica.send_signal(signal.SIGTERM)
        _, err = replica.communicate(timeout=60)
    assert replica.returncode == 0, err
