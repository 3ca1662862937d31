"""An app's ``jobs.py`` that raises as it is imported, as real ``manage.py`` processes of the
example project see it: one line per module naming the module and the line of the project's
code that raised (no traceback), ``migrate`` goes on with it as a warning, ``check`` and
``replicron run`` refuse; and a trigger that fails as its job is added names the job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.django.project import PROJECT, Project, fresh_project
from tests.helpers import REPO

pytestmark = pytest.mark.timeout(300)

BILLING_JOBS = """\
from replicron import cron
from replicron.contrib.django import job


@job(cron("0 3 * * *"), name="nightly-invoices")
def nightly_invoices() -> None:
    pass


@job(cron("61 * * * *"), name="charge-card")
def charge_card() -> None:
    pass
"""

#: A jobs.py whose trigger comes from a helper module of the app that raises.
SHIPPING_JOBS = """\
from replicron.contrib.django import job

from .schedules import HOURLY


@job(HOURLY, name="sync-carriers")
def sync_carriers() -> None:
    pass
"""
SHIPPING_SCHEDULES = """\
from replicron import every

HOURLY = every(hours=1, jitter=hour)
"""

OWN_TRIGGER_JOBS = """\
from replicron.contrib.django import job


class BookClosing:
    \"\"\"A trigger of the project's own: the books close on days only finance knows.\"\"\"

    def next_after(self, instant):
        raise ValueError("no closing calendar for this year")


@job(BookClosing(), name="close-books")
def close_books() -> None:
    pass
"""


def app(root: Path, name: str, **modules: str) -> None:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, text in modules.items():
        (package / f"{module}.py").write_text(text)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    """The example project with two more apps, billing and shipping, in ``tmp_path``."""
    yield from fresh_project(
        DJANGO_SETTINGS_MODULE="tests.django.override_settings",
        EXTRA_INSTALLED_APPS='["billing", "shipping"]',
        PYTHONPATH=os.pathsep.join([str(PROJECT), str(REPO), str(tmp_path)]),
    )


def test_a_jobs_module_that_raises_is_one_line_migrate_goes_on_check_and_run_refuse(
    project: Project, tmp_path: Path
) -> None:
    app(tmp_path, "billing", jobs=BILLING_JOBS)
    app(tmp_path, "shipping", jobs=SHIPPING_JOBS, schedules=SHIPPING_SCHEDULES)
    billing = (
        f"cannot import billing.jobs: {tmp_path / 'billing' / 'jobs.py'}:10: '61' is out of "
        "range 0-59 in the minute field of cron expression '61 * * * *'"
    )
    shipping = (
        f"cannot import shipping.jobs: {tmp_path / 'shipping' / 'schedules.py'}:3: "
        "NameError: name 'hour' is not defined"
    )

    migrated = project.manage("migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying replicron.0001_initial... OK" in migrated.stdout
    assert migrated.stderr.splitlines() == [
        "System check identified some issues:",
        "",
        "WARNINGS:",
        f"?: (replicron.W001) {billing}",
        f"?: (replicron.W001) {shipping}",
    ]

    checked = project.manage("check")
    assert checked.returncode == 1
    assert checked.stderr.splitlines() == [
        "SystemCheckError: System check identified some issues:",
        "",
        "ERRORS:",
        f"?: (replicron.E001) {billing}",
        f"?: (replicron.E001) {shipping}",
        "",
        "System check identified 2 issues (0 silenced).",
    ]

    replicron_check = project.manage("replicron", "check")
    assert replicron_check.returncode == 2
    assert replicron_check.stderr == f"CommandError: {billing}\n{shipping}\n"

    run = project.manage("replicron", "run")
    assert run.returncode == 1
    assert f"?: (replicron.E001) {billing}" in run.stderr.splitlines()
    assert "Traceback" not in run.stderr
    assert project.sql("SELECT replica_id FROM replicron_replicas") == []  # it never started


def test_a_trigger_that_fails_as_its_job_is_added_names_the_job(
    project: Project, tmp_path: Path
) -> None:
    app(tmp_path, "billing", jobs=OWN_TRIGGER_JOBS)
    app(tmp_path, "shipping")  # no jobs.py: nothing to say

    checked = project.manage("replicron", "check")
    assert checked.returncode == 2
    assert checked.stderr == (
        "CommandError: billing.jobs.close_books: job 'close-books': no closing calendar for "
        "this year\n"
    )
