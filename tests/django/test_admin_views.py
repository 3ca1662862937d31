"""What the example project shows of its jobs, with its settings as they ship: ``manage.py
replicron check`` in each job's time zone, and the admin's words, times and links."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.django.project import Project, fresh_project
from tests.helpers import poll_until

pytestmark = pytest.mark.timeout(300)

BASE = "/admin/replicron"


@pytest.fixture
def project() -> Iterator[Project]:
    yield from fresh_project(
        DJANGO_SETTINGS_MODULE="tests.django.override_settings", EXAMPLE_HEARTBEAT_SECONDS="1"
    )


def test_check_shows_triggers_as_written_and_fire_times_in_the_jobs_zone(
    project: Project,
) -> None:
    done = project.manage(
        "replicron", "check", REPLICRON_OVERRIDE=json.dumps({"timezone": "Europe/Berlin"})
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "heartbeat: every 1s" in lines
    nightly = lines.index("nightly-cleanup: cron('0 3 * * *', tz='Europe/Berlin')")
    # 03:00 in Berlin, said as the daemon says it: +01:00 in winter, +02:00 in summer.
    assert re.fullmatch(r"    \d{4}-\d\d-\d\dT03:00:00\+0[12]:00", lines[nightly + 1])


def _stop(replica: subprocess.Popen[str]) -> None:
    replica.send_signal(signal.SIGTERM)
    _, err = replica.communicate(timeout=60)
    assert replica.returncode == 0, err


def _page(project: Project, path: str) -> str:
    seen: dict[str, Any] = project.admin("text", path)
    assert seen["status"] == 200, path
    return str(seen["text"])


def test_the_admin_shows_states_seconds_the_last_outcome_and_the_live_replicas(
    project: Project,
) -> None:
    assert project.manage("migrate", "--noinput").returncode == 0
    heartbeats = "SELECT count(*) FROM replicron_runs WHERE outcome = 'succeeded'"
    earlier = project.start("replicron", "run")
    try:
        poll_until("a heartbeat", lambda: project.sql(heartbeats)[0][0] >= 1, 60)
    finally:
        _stop(earlier)
    replica = project.start("replicron", "run")
    try:
        poll_until("two more", lambda: project.sql(heartbeats)[0][0] >= 3, 60)
        jobs = _page(project, f"{BASE}/registeredjob/")
        job = _page(project, f"{BASE}/registeredjob/heartbeat/change/")
        runs = _page(project, f"{BASE}/run/?job__exact=heartbeat")
        live = _page(project, f"{BASE}/replica/")
        departed = _page(project, f"{BASE}/replica/?presence=departed")
        ids = dict(project.sql("SELECT stopped_at IS NULL, replica_id FROM replicron_replicas"))
    finally:
        _stop(replica)

    # The state in the words of replicron status and the page (the per-second job may be
    # caught mid-run); ticks to the second.
    assert re.search(r'<td class="field-state">(ok|running)</td>', jobs), jobs
    assert re.search(r'<td class="field-state">no runs yet</td>', jobs), jobs
    assert re.search(r'field-last_run">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d', jobs), jobs
    assert "every 1s" in jobs
    # The job's page: its last outcome and a link to its runs.
    assert "succeeded" in job
    assert f'href="{BASE}/run/?job__exact=heartbeat"' in job
    assert re.search(r'field-tick">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d', runs), runs
    # The replica running now; the one before it among the departed.
    assert ids[True] in live
    assert ids[False] not in live
    assert ids[False] in departed
    assert ids[True] not in departed
