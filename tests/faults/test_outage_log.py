"""What a daemon's log says through a database outage: pgbouncer, in front of the database
for a daemon in lease mode (any pooler works for it), is killed with SIGKILL and started
again seconds later. One WARNING when the database goes, with the reason; one INFO once a
statement gets its answer again (not before pgbouncer is back); no traceback, no ERROR.
Before, such an outage logged an ERROR with its traceback for every claim, about two a
second, and "backend reachable again" while the database was still down."""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests._harness.daemons import Daemons, config_text, daemons_of_test
from tests.faults.cluster import Database, PgCluster
from tests.faults.pooler import PgBouncer
from tests.faults.workdir import chown_postgres, free_port

Summary = Callable[[str], None]
OUTAGE_S = 4.0
#: A tick's outcome, one record per tick by design: not what this test counts.
OUTCOMES = {"missed", "succeeded", "failed", "skipped_overlap"}


@pytest.fixture
def pgbouncer(suite_dir: Path, pg: PgCluster) -> Iterator[PgBouncer]:
    """A pgbouncer of the test's own (transaction mode): the suite's are shared."""
    workdir = suite_dir / f"outage-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    chown_postgres(workdir)
    bouncer = PgBouncer(workdir, pool_mode="transaction", port=free_port(), server_port=pg.port)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def daemons(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemons]:
    with daemons_of_test(request, Daemons(tmp_path)) as fleet:
        yield fleet


def records(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def at(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()


@pytest.mark.timeout(90)
def test_a_database_outage_is_one_warning_and_one_info_once_it_answers(
    daemons: Daemons, pgbouncer: PgBouncer, db: Database, summary: Summary
) -> None:
    scheduler = {
        "database_url": pgbouncer.dsn(db.name),
        "coordination": "lease",
        "log_format": "json",
    }
    jobs = [
        {"name": "every-second", "every": "1s", "command": ["true"]},
        {"name": "every-two", "every": "2s", "command": ["true"]},
    ]
    daemon = daemons.start("daemon", config_text(scheduler, jobs))
    daemon.wait_log('"event": "succeeded"', 20, count=3)
    before = len(daemon.log().splitlines())
    pgbouncer.kill()
    killed = time.time()
    daemon.wait_log('"event": "backend_unavailable"', 10)
    time.sleep(max(0.0, killed + OUTAGE_S - time.time()))
    pgbouncer.start()
    back = time.time()
    daemon.wait_log('"event": "backend_available"', 20)
    daemon.wait_log('"event": "succeeded"', 10, count=6)
    assert daemons.stop(["daemon"]) == {"daemon": 0}
    said = records(daemon.log())
    lines = len(daemon.log().splitlines())
    health = [r for r in said if r.get("event") in ("backend_unavailable", "backend_available")]
    loud = [
        r for r in said if r["level"] in ("WARNING", "ERROR") and r.get("event") not in OUTCOMES
    ]
    summary(
        f"[pgbouncer killed for {back - killed:.1f} s, lease mode] {lines - before} lines after "
        f"the kill ({lines} in all), of which the backend's health: "
        f"{[(r['level'], r['message'][:60]) for r in health]}"
    )
    assert [(r["level"], r["event"]) for r in health] == [
        ("WARNING", "backend_unavailable"),
        ("INFO", "backend_available"),
    ]
    went, came = health
    assert "cannot connect to PostgreSQL" in went["message"], went
    assert "\n" not in went["message"]
    assert at(came) >= back, "said to be back before pgbouncer was"
    # How long it was away, as said: from the first failure to the first answer after it.
    away = re.search(r"after ([0-9.]+)s$", came["message"])
    assert away is not None, came
    assert OUTAGE_S - 1 < float(away[1]) < back - killed + 3, (came, back - killed)
    assert loud == [went], loud
    assert [r for r in said if "traceback" in r] == []
