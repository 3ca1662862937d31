"""A replica in advisory mode behind pgbouncer in transaction mode is refused with the way
out in the user's own words: row-lease coordination first, else a session-mode pooler, each
named as the surface that built the backend sets it (Python's keyword arguments, the
daemon's TOML keys, the Django project's ``REPLICRON`` keys)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replicron.postgres import PostgresBackend, TransactionPoolerError
from tests._harness.daemons import config_text
from tests.django.project import Project
from tests.faults.cluster import Database
from tests.faults.pooler import PgBouncers

pytestmark = pytest.mark.timeout(120)


def refusal_at_start(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a process that could not start (exit status 1) saying why."""
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    [line] = [line for line in said.splitlines() if "cannot start" in line]
    assert "PostgresBackend" not in line, line  # no Python for a user of another surface
    return line


def test_python_is_told_the_keyword_arguments(db: Database, pgbouncers: PgBouncers) -> None:
    async def refusal() -> str:
        backend = PostgresBackend(pgbouncers["transaction"].dsn(db.name))
        try:
            with pytest.raises(TransactionPoolerError) as refused:
                await backend.open("r1")
        finally:
            await backend.close()
        return str(refused.value)

    said = asyncio.run(refusal())
    assert 'PostgresBackend(..., coordination="lease")' in said, said
    assert "PostgresBackend(..., session_pooler=True)" in said, said
    assert said.index("coordination") < said.index("session_pooler"), said  # the fix first


def test_the_daemon_is_told_its_toml_keys(
    db: Database, pgbouncers: PgBouncers, tmp_path: Path
) -> None:
    settings = {"database_url": pgbouncers["transaction"].dsn(db.name)}
    job = {"name": "nightly", "cron": "0 3 * * *", "command": ["true"]}
    config = tmp_path / "jobs.toml"
    config.write_text(config_text(settings, [job]))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REPLICRON_")}
    done = subprocess.run(
        [sys.executable, "-m", "replicron", "run", str(config)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = refusal_at_start(done)
    assert 'coordination = "lease" in [scheduler]' in line, line
    assert "session_pooler = true in [scheduler]" in line, line


def test_django_is_told_its_replicron_keys(db: Database, pgbouncers: PgBouncers) -> None:
    project = Project(pgbouncers["transaction"].dsn(db.name))
    done = project.manage("replicron", "run")
    line = refusal_at_start(done)
    assert "settings.REPLICRON['coordination'] = 'lease'" in line, line
    assert "'session_pooler': True in settings.REPLICRON['backend_options']" in line, line
