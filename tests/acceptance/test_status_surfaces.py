"""What an operator sees of a cluster of real daemons on one state directory, with the
settings the docs show (no ``replica_id``, no namespace): the overdue metric of a job that
was dropped from the config, and the replicas list after restarts."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests._harness.daemons import Daemons, config_text
from tests.acceptance.test_daemon import free_port, get, samples, stop_cleanly
from tests.helpers import embedded_rows, run_cli

pytestmark = pytest.mark.timeout(120)

#: A job's interval and its misfire_grace: a tick without a row goes overdue this long after it.
EVERY, GRACE = "1s", "1s"


def _job(name: str) -> dict[str, object]:
    return {"name": name, "every": EVERY, "misfire_grace": GRACE, "command": ["true"]}


def test_a_job_dropped_from_the_config_is_overdue_in_the_metrics(
    daemons: Daemons, summary: Callable[[str], None]
) -> None:
    state_dir = daemons.workdir / "state"
    settings = {"state_dir": str(state_dir), "stop_timeout": "5s"}
    first = daemons.start("first", config_text(settings, [_job("kept"), _job("dropped")]))
    daemons.wait_until(
        "a run of 'dropped'",
        lambda: any(row["outcome"] for row in embedded_rows(state_dir, "dropped")),
        20,
    )
    stop_cleanly(first)

    port = free_port()
    started = time.monotonic()
    second = daemons.start(
        "second", config_text({**settings, "http": f"127.0.0.1:{port}"}, [_job("kept")])
    )

    def overdue_series() -> dict[str, float] | None:
        got = get(f"http://127.0.0.1:{port}/metrics")
        if got is None or got[0] != 200:
            return None
        found = {
            labels["job"]: value
            for labels, value in samples(got[2].decode(), "replicron_job_overdue")
        }
        return found if found.get("dropped") == 1 else None

    overdue = daemons.wait_until("replicron_job_overdue{job='dropped'} 1", overdue_series, 30)
    took = time.monotonic() - started
    assert overdue == {"kept": 0, "dropped": 1}
    check = run_cli("status", "--state-dir", str(state_dir), "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "dropped: overdue" in check.stdout

    stop_cleanly(second)
    summary(f"a dropped job's overdue gauge over HTTP: 1 after {took:.1f} s")


def test_restarts_leave_history_and_status_lists_the_live_replica(
    daemons: Daemons, summary: Callable[[str], None]
) -> None:
    state_dir = daemons.workdir / "state"
    settings = {"state_dir": str(state_dir), "stop_timeout": "5s"}
    config = config_text(settings, [_job("kept")])
    started = time.monotonic()
    for run in range(3):  # three short runs, a replica id each (the default: host:pid)
        daemon = daemons.start(f"run-{run}", config)
        daemon.wait_log("started replica", 20)
        stop_cleanly(daemon)
    port = free_port()
    daemons.start("live", config_text({**settings, "http": f"127.0.0.1:{port}"}, [_job("kept")]))

    def page() -> str | None:
        got = get(f"http://127.0.0.1:{port}/")
        html = got[2].decode() if got is not None and got[0] == 200 else ""
        return html if "Replicas (1 alive" in html else None

    html = daemons.wait_until("the status page with the live replica", page, 20)
    took = time.monotonic() - started
    assert "Replicas (1 alive, 3 departed)" in html

    table = run_cli("status", "--state-dir", str(state_dir)).stdout.splitlines()
    replicas = table[table.index("") + 1 :]
    assert replicas[0].split()[:2] == ["REPLICA", "ALIVE"]
    assert [line.split()[1] for line in replicas[1:2]] == ["yes"]
    assert replicas[2].startswith("3 departed replicas not listed"), replicas
    listed = run_cli("status", "--state-dir", str(state_dir), "--departed").stdout.splitlines()
    alive = [line.split()[1] for line in listed[listed.index("") + 2 :]]
    assert alive == ["yes", "no", "no", "no"]
    summary(f"3 restarts then one live daemon: 1 replica listed, 3 counted ({took:.1f} s)")
