"""The runtime role of docs/postgres.md ("Privileges"): replicas run with only the grants the
docs list, once the owner has applied the migrations. The grants are read from the docs, so
the two cannot drift."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from replicron import Outcome, Scheduler, every
from replicron.postgres import CoordinationMode, PostgresBackend, migrate
from replicron.testing import FakeClock
from tests.helpers import Recorder, poll_until, z

DOCS = Path(__file__).resolve().parents[2] / "docs" / "postgres.md"


def documented_grants() -> list[str]:
    section = DOCS.read_text().split("## Privileges", 1)[1]
    [block] = re.findall(r"```sql\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    return [line for line in block.splitlines() if line.startswith("GRANT")]


@pytest.fixture
def runtime_dsn(dsn: str) -> Iterator[str]:
    """A DSN for a new role holding the documented grants only (and no CREATE)."""
    role = f"replicron_app_{uuid.uuid4().hex[:8]}"
    asyncio.run(migrate(dsn))
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(f"CREATE ROLE {role} LOGIN")
        owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        for signature in ("text, text, integer, uuid[]", "text, text, integer, uuid[], boolean"):
            owner.execute(
                f"REVOKE EXECUTE ON FUNCTION replicron_runs_reached({signature}) FROM PUBLIC"
            )
        owner.execute("REVOKE EXECUTE ON FUNCTION replicron_lead(text, text, interval) FROM PUBLIC")
        owner.execute("REVOKE EXECUTE ON FUNCTION replicron_advisory_locks() FROM PUBLIC")
        for grant in documented_grants():
            owner.execute(grant.replace(" TO app;", f" TO {role}"))
    try:
        yield make_conninfo(dsn, user=role)
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(f"DROP OWNED BY {role}")
            owner.execute(f"DROP ROLE {role}")


async def _status(dsn: str) -> list[tuple[str, str | None]]:
    reader = PostgresBackend(dsn, migrate=False, heartbeat_interval=3600)
    await reader.open("status-reader")
    try:
        return [(job.job, job.last_outcome) for job in await reader.status()]
    finally:
        await reader.close()


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_the_documented_grants_are_all_a_replica_needs(
    runtime_dsn: str, coordination: CoordinationMode
) -> None:
    start = z(2026, 1, 1)
    clock, recorder = FakeClock(start), Recorder()
    backend = PostgresBackend(
        runtime_dsn, migrate=False, heartbeat_interval=0.2, coordination=coordination
    )
    # In leader mode: the lease's row is read and written with the documented grants too.
    with Scheduler(clock=clock, backend=backend, listeners=[recorder], leader=True) as scheduler:
        job = scheduler.add_job(every(seconds=10), _noop, name="limited", max_runs=1)
        poll_until("the lease", lambda: scheduler.is_leader, 10)
        for k in (1, 2):
            clock.set(start + timedelta(seconds=10 * k))
            scheduler.wait_idle()
        job.run_now()
        scheduler.wait_idle()
    assert [(e.outcome, e.manual) for e in recorder.of("after_success")] == [
        (Outcome.SUCCEEDED, False),
        (Outcome.SUCCEEDED, True),
    ]
    assert recorder.of("on_lock_error") == []
    assert asyncio.run(_status(runtime_dsn)) == [("limited", "succeeded")]


def _noop() -> None:
    pass
