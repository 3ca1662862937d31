"""The daemon's ``[notify]`` table and a job's ``ping_url``, end to end: a real ``replicron
run`` process, a command job that fails, and a real HTTP server that receives one alert and
the job's pings."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from tests._harness.daemons import Daemons, config_text, toml
from tests.receiver import Receiver, dripping, receiving

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as server:
        yield server


def test_a_failing_command_job_posts_one_alert_and_pings_start_then_fail(
    daemons: Daemons, receiver: Receiver
) -> None:
    token = "hook-SECRET-token"
    job = {
        "name": "broken",
        "every": "1s",
        "max_runs": 1,
        "command": ["sh", "-c", "echo 'disk full' >&2; exit 3"],
        "ping_url": receiver.url("/ping/0f1e-uuid"),
    }
    settings = {"state_dir": str(daemons.workdir / "state"), "replica_id": "d1"}
    notify = {"url": receiver.url(f"/services/{token}"), "backoff": "100ms"}
    text = config_text(settings, [job])
    text += "\n[notify]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in notify.items())
    daemon = daemons.start("d1", text)
    daemon.wait_log("started replica d1 with 1 jobs", 30)
    received = receiver.wait_for(3, 30)
    code, _ = daemon.stop(20)
    assert code == 0, daemon.log()
    assert len(receiver.received) == 3
    alerts = [r for r in received if r.path.startswith("/services/")]
    pings = [r.path for r in received if r.path.startswith("/ping/")]
    assert pings == ["/ping/0f1e-uuid/start", "/ping/0f1e-uuid/fail"]
    [alert] = alerts
    body = alert.json()
    assert (body["event"], body["job"], body["replica"]) == ("failed", "broken", "d1")
    assert body["error"].startswith("CommandFailed: exit status 3"), body
    assert body["text"].startswith("replicron: job 'broken' failed (tick ")
    assert token not in daemon.log()
    assert "0f1e-uuid" not in daemon.log()


@pytest.mark.parametrize("backend", ["embedded", "postgres"])
def test_an_alert_comes_on_the_defaults_without_a_replica_id(
    daemons: Daemons, receiver: Receiver, backend: str, request: pytest.FixtureRequest
) -> None:
    # As the docs show it: no replica_id (the daemon makes one up), no namespace, the
    # embedded state directory where the daemon starts, or a database_url.
    settings = {"database_url": request.getfixturevalue("dsn")} if backend == "postgres" else {}
    job = {"name": "broken", "every": "1s", "max_runs": 1, "command": ["sh", "-c", "exit 3"]}
    text = config_text(settings, [job]) + f"\n[notify]\nurl = {toml(receiver.url())}\n"
    daemon = daemons.start("d1", text)
    daemon.wait_log("started replica", 30)
    [alert] = receiver.wait_for(1, 30)
    code, _ = daemon.stop(20)
    assert code == 0, daemon.log()
    body = alert.json()
    assert (body["event"], body["job"]) == ("failed", "broken"), body
    assert body["replica"].endswith(f":{daemon.pid}"), body  # the id made up: host:pid


def test_hung_endpoints_delay_no_run_a_reload_or_the_stop(
    daemons: Daemons, receiver: Receiver
) -> None:
    hook, uuid = "hook-SECRET-token", "c0ffee-uuid-SECRET"
    receiver.hang.set()  # the first alert is held there for ever
    settings = {
        "state_dir": str(daemons.workdir / "state"),
        "replica_id": "d1",
        "stop_timeout": "2s",
    }
    with dripping() as drip_url, receiving() as second:
        job = {
            "name": "broken",
            "every": "1s",
            "command": ["sh", "-c", "exit 3"],
            "ping_url": f"{drip_url}/{uuid}",
        }

        def config(url: str) -> str:
            notify = {"url": url, "timeout": "2s", "flush_timeout": "1s", "backoff": "100ms"}
            text = config_text(settings, [job])
            return text + "\n[notify]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in notify.items())

        daemon = daemons.start("d1", config(receiver.url(f"/services/{hook}")))
        daemon.wait_log("started replica d1 with 1 jobs", 30)
        receiver.wait_for(1, 30)
        began, runs = time.monotonic(), len(daemon.lines("run failed"))
        daemon.wait_log("run failed", 60, count=runs + 5)  # runs go on, once a second
        five_runs = time.monotonic() - began
        daemons.write_config("d1", config(second.url(f"/services/{hook}")))
        daemon.signal(signal.SIGHUP)
        daemon.wait_log("reloaded: 1 jobs", 30)
        assert second.wait_for(1, 30)[0].json()["job"] == "broken"
        code, stopping = daemon.stop(60)
    assert code == 0, daemon.log()
    assert five_runs < 30, five_runs
    # stop_timeout 2 s + flush_timeout 1 s, on a loaded machine
    assert stopping < 15, stopping
    assert hook not in daemon.log()
    assert uuid not in daemon.log()
