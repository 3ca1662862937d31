"""Operating a cluster from the command line, against replica processes on PostgreSQL in real
time: pausing and resuming a job on every replica, and `replicron status --check` telling a
job overdue once every replica is gone."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from tests.acceptance.conftest import Cluster
from tests.helpers import run_cli

pytestmark = pytest.mark.timeout(120)

#: A claim reads the pause in its own statement; one already sent when the pause commits,
#: up to the claim-ahead margin before its tick, still runs that tick.
IN_FLIGHT = timedelta(milliseconds=500)


def ledger(cluster: Cluster, job: str) -> list[tuple[datetime, str | None, str]]:
    rows = cluster.rows(
        "SELECT scheduled_at, outcome, replica_id FROM replicron_runs WHERE job = %s"
        " ORDER BY scheduled_at",
        (job,),
    )
    return [(at, outcome, replica) for at, outcome, replica in rows]


def started_ticks(cluster: Cluster, job: str) -> list[datetime]:
    rows = cluster.rows(
        "SELECT scheduled_at FROM acceptance_runs WHERE job = %s ORDER BY scheduled_at", (job,)
    )
    return [at for (at,) in rows]


def test_a_paused_job_runs_on_no_replica_and_runs_again_after_resume(
    cluster: Cluster, dsn: str, summary: Callable[[str], None]
) -> None:
    replicas = ("r1", "r2", "r3")
    for replica in replicas:
        cluster.start(replica, job="tick", every_s=0.5, task_ms=20)
    cluster.wait_ready(replicas)
    cluster.wait_until("two runs", lambda: len(started_ticks(cluster, "tick")) >= 2, 20)

    paused = run_cli("pause", "tick", "--database-url", dsn)
    assert paused.returncode == 0, paused.stderr
    assert "paused 'tick'" in paused.stdout
    paused_at = cluster.now()
    again = run_cli("pause", "tick", "--database-url", dsn)
    assert "was paused already" in again.stdout

    def paused_ticks() -> int | None:
        count = sum(outcome == "paused" for _, outcome, _ in ledger(cluster, "tick"))
        return count if count >= 6 else None

    cluster.wait_until("six ticks recorded paused", paused_ticks, 20)
    status = json.loads(run_cli("status", "--database-url", dsn, "--json").stdout)
    [view] = [job for job in status["jobs"] if job["job"] == "tick"]
    assert view["paused"]["paused_by"].startswith("replicron-cli@")
    assert view["overdue"] is False
    resume_sent = cluster.now()  # a tick after this may run: the resume may commit before it
    resumed = run_cli("resume", "tick", "--database-url", dsn)
    assert resumed.returncode == 0, resumed.stderr
    resumed_at = cluster.now()
    cluster.wait_until(
        "a run after the resume",
        lambda: any(at > resumed_at for at in started_ticks(cluster, "tick")),
        20,
    )
    assert cluster.stop() == dict.fromkeys(replicas, 0)

    ran = started_ticks(cluster, "tick")
    rows = ledger(cluster, "tick")
    during = [at for at in ran if paused_at + IN_FLIGHT < at <= resume_sent]
    assert during == [], f"runs while paused: {during}"
    paused_rows = [at for at, outcome, _ in rows if outcome == "paused"]
    assert paused_rows
    assert min(paused_rows) >= paused_at - IN_FLIGHT
    # Resuming replays nothing: no paused tick ran afterwards, and every tick has one row.
    assert not set(paused_rows) & set(ran)
    assert len({at for at, _, _ in rows}) == len(rows)
    assert {replica for _, outcome, replica in rows if outcome == "paused"} <= set(replicas)
    summary(
        f"pause/resume, 3 replicas: {len(paused_rows)} ticks paused, 0 run while paused, "
        f"{len([at for at in ran if at > resumed_at])} run after resume"
    )


@pytest.mark.parametrize("how", ["shutdown", "kill -9"])
def test_status_check_reports_a_job_overdue_once_every_replica_stopped(
    cluster: Cluster, dsn: str, summary: Callable[[str], None], how: str
) -> None:
    for replica in ("r1", "r2"):
        cluster.start(replica, job="beat", every_s=1, task_ms=10, misfire_grace=1.0)
    cluster.wait_ready(["r1", "r2"])
    cluster.wait_until("a run", lambda: started_ticks(cluster, "beat") or None, 20)
    healthy = run_cli("status", "--database-url", dsn, "--check")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.startswith("OK: 1 jobs")

    if how == "shutdown":
        assert cluster.stop() == {"r1": 0, "r2": 0}
    else:  # no last word in the registry: the ticks written as they started must do
        cluster.kill("r1")
        cluster.kill("r2")
    last = max(at for at, _, _ in ledger(cluster, "beat"))
    # The next tick, then its grace, pass with nobody up to run it or to notice.
    cluster.wait_until(
        "the next tick's grace to pass",
        lambda: cluster.now() > last + timedelta(seconds=2.5) or None,
        10,
    )
    check = run_cli("status", "--database-url", dsn, "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    [line] = check.stdout.splitlines()
    assert line.startswith("beat: overdue: the tick due at ")
    status = json.loads(run_cli("status", "--database-url", dsn, "--json").stdout)
    [view] = status["jobs"]
    assert view["overdue"] is True
    assert datetime.fromisoformat(view["overdue_since"]) > last
    assert [r["alive"] for r in status["replicas"]] == [False, False]
    table = run_cli("status", "--database-url", dsn)
    assert "OVERDUE" in table.stdout
    summary(f"overdue with every replica down ({how}): {line}")
