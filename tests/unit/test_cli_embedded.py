"""`replicron status`, `pause` and `resume` on an embedded state directory, as real
processes: the same view as on PostgreSQL, with no server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from replicron import EmbeddedBackend, Outcome, Scheduler, every
from replicron.testing import FakeClock
from replicron.web import status_app
from tests.helpers import poll_until, run_cli, z
from tests.unit.test_web import call

START = z(2026, 1, 1)


def broken() -> None:
    raise RuntimeError("disk full")


def test_status_pause_and_resume_on_a_state_dir(tmp_path: Path) -> None:
    clock = FakeClock(START)
    ran: list[str] = []
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="node-1")
    s.add_job(every(seconds=10), lambda: ran.append("ok"), name="ok")
    s.add_job(every(seconds=10), broken, name="broken")
    with s:  # registered as it starts
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=10))
        s.wait_idle()

        paused = run_cli("pause", "ok", "--state-dir", str(tmp_path))
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("paused 'ok'")
        clock.set(START + timedelta(seconds=20))
        s.wait_idle()
        ok = s.get_job("ok").last_run
        assert ok is not None
        assert ok.outcome is Outcome.PAUSED
        assert ran == ["ok"]

        status = json.loads(run_cli("status", "--state-dir", str(tmp_path), "--json").stdout)
        jobs = {job["job"]: job for job in status["jobs"]}
        assert jobs["ok"]["paused"]["paused_by"].startswith("replicron-cli@")
        assert jobs["ok"]["last_outcome"] == "paused"
        assert jobs["broken"]["last_outcome"] == "failed"
        assert jobs["broken"]["last_error"] == "RuntimeError: disk full"
        assert [(r["replica_id"], r["alive"], r["jobs"]) for r in status["replicas"]] == [
            ("node-1", True, ["broken", "ok"])
        ]
        check = run_cli("status", "--state-dir", str(tmp_path), "--check")
        assert check.returncode == 1
        # The fake clock stands in January: by the host's clock, broken's next tick is long
        # overdue; ok is paused, so it is not.
        assert [line.split(" has no run ")[0] for line in check.stdout.splitlines()] == [
            "broken: overdue: the tick due at 2026-01-01T00:00:30+00:00",
            "broken: last run failed (tick 2026-01-01T00:00:20+00:00): RuntimeError: disk full",
        ]

        resumed = run_cli("resume", "ok", "--state-dir", str(tmp_path))
        assert resumed.stdout.startswith("resumed 'ok'")
        clock.set(START + timedelta(seconds=30))
        s.wait_idle()
        assert ran == ["ok", "ok"]
    table = run_cli("status", "--state-dir", str(tmp_path)).stdout.splitlines()
    assert table[0].split()[:2] == ["JOB", "LAST"]
    assert [line.split()[0] for line in table[1:3]] == ["broken", "ok"]
    assert "broken: last error: RuntimeError: disk full" in table
    # Shut down: history, counted, and listed when asked for (with its two jobs).
    assert table[table.index("") + 1 :][0] == "no live replica"
    assert table[table.index("") + 2].startswith(
        "1 departed replica not listed (the latest, node-1"
    )
    assert table[table.index("") + 2].endswith("--departed lists them")
    listed = run_cli("status", "--state-dir", str(tmp_path), "--departed").stdout.splitlines()
    assert listed[listed.index("") + 2].split()[:3] == ["node-1", "no", "2"]


def test_a_state_dir_nobody_used_is_one_clear_line(tmp_path: Path) -> None:
    result = run_cli("status", "--state-dir", str(tmp_path / "nothing"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "has no replicron ledger" in result.stderr
    both = run_cli("status", "--state-dir", str(tmp_path), "--database-url", "postgresql://x")
    assert both.returncode == 2
    assert "not both" in both.stderr


def test_the_status_of_an_unopened_backend_is_read_from_any_loop(tmp_path: Path) -> None:
    clock = FakeClock(START)
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="node-1")
    s.add_job(every(seconds=10), lambda: None, name="ok")
    s.start()
    s.shutdown()
    status = asyncio.run(EmbeddedBackend(tmp_path).cluster_status())
    view = status.job("ok")
    assert view is not None
    assert view.trigger == "every 10s"
    assert view.next_due == START + timedelta(seconds=10)


def leaky() -> None:
    raise RuntimeError("cannot reach postgresql://etl:Hunter2Secret@dw.internal/dw")


def test_a_dropped_job_stays_overdue_until_forgotten_and_no_output_shows_a_password(
    tmp_path: Path,
) -> None:
    clock = FakeClock(START)
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="old-build")
    s.add_job(every(seconds=10), leaky, name="etl")
    with s:
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=10))
        s.wait_idle()
    outputs = [
        run_cli("status", "--state-dir", str(tmp_path), *flags) for flags in ([], ["--json"])
    ]
    check = run_cli("status", "--state-dir", str(tmp_path), "--check")
    assert check.returncode == 1
    assert [line.split(":")[1].strip() for line in check.stdout.splitlines()] == [
        "overdue",
        "last run failed (tick 2026-01-01T00",
    ]
    for result in [*outputs, check]:
        assert "Hunter2Secret" not in result.stdout + result.stderr
        assert "postgresql://etl:***@dw.internal/dw" in result.stdout

    forgotten = run_cli("forget", "etl", "--state-dir", str(tmp_path))
    assert forgotten.returncode == 0, forgotten.stderr
    assert forgotten.stdout == "forgot 'etl': no longer expected (it was registered by old-build)\n"
    after = run_cli("status", "--state-dir", str(tmp_path), "--check")
    assert after.returncode == 0  # a job no replica expects: its last failure is history
    table = run_cli("status", "--state-dir", str(tmp_path)).stdout.splitlines()
    assert table[1].split()[0] == "etl"
    assert "unregistered" in table[1].split()
    again = run_cli("forget", "etl", "--state-dir", str(tmp_path))
    assert again.stdout == "'etl' is not in the registry\n"


def test_a_job_a_live_replica_schedules_is_not_forgotten(tmp_path: Path) -> None:
    clock = FakeClock(START)
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="live")
    s.add_job(every(seconds=10), lambda: None, name="ok")
    with s:
        refused = run_cli("forget", "ok", "--state-dir", str(tmp_path))
        assert refused.returncode == 1
        assert refused.stdout == (
            "'ok' is still scheduled by live replicas live: remove it from their code first\n"
        )
        view = s.cluster_status().job("ok")
        assert view is not None
        assert view.scheduled_by == ("live",)


def test_status_finds_the_backend_in_a_daemon_config(tmp_path: Path) -> None:
    state = tmp_path / "state"
    clock = FakeClock(START)
    s = Scheduler(clock=clock, backend=EmbeddedBackend(state), replica_id="node-1")
    s.add_job(every(seconds=10), lambda: None, name="from-config")
    with s:
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=10))
        s.wait_idle()
    config = tmp_path / "jobs.toml"
    config.write_text(f'[scheduler]\nstate_dir = "{state}"\n')
    status = run_cli("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    assert [job["job"] for job in json.loads(status.stdout)["jobs"]] == ["from-config"]
    both = run_cli("status", "--config", str(config), "--state-dir", str(state))
    assert both.returncode == 2
    assert "not both" in both.stderr
    config.write_text("[scheduler]\nstate_dir = 3\n")
    bad = run_cli("status", "--config", str(config))
    assert bad.returncode == 2
    assert "state_dir: must be a string" in bad.stderr


def test_status_names_the_leader_while_it_lives(tmp_path: Path) -> None:
    clock = FakeClock(START)
    with Scheduler(
        clock=clock, backend=EmbeddedBackend(tmp_path), replica_id="node-1", leader=True
    ) as s:
        s.add_job(every(seconds=10), lambda: None, name="led")
        poll_until("the lease", lambda: s.is_leader, 10)
        status = json.loads(run_cli("status", "--state-dir", str(tmp_path), "--json").stdout)
        assert status["leader"] == "node-1"
        table = run_cli("status", "--state-dir", str(tmp_path)).stdout.splitlines()
        assert table[-1] == "leader: node-1"
    status = json.loads(run_cli("status", "--state-dir", str(tmp_path), "--json").stdout)
    assert status["leader"] is None  # stopped: nobody leads


def test_pause_and_resume_refuse_a_job_no_replica_registered(tmp_path: Path) -> None:
    clock = FakeClock(START)
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path))
    s.add_job(every(seconds=10), lambda: None, name="charge-card")
    s.add_job(every(seconds=10), lambda: None, name="nightly-cleanup")
    state = ("--state-dir", str(tmp_path))
    with s:  # registered as it starts
        typo = run_cli("pause", "charge-crad", *state)
        assert (typo.returncode, typo.stdout) == (2, "")
        assert typo.stderr == (
            "replicron: error: no replica has registered a job named 'charge-crad'; "
            "registered jobs: 'charge-card', 'nightly-cleanup'; to pause a job not deployed "
            "yet, add --force\n"
        )
        resumed = run_cli("resume", "charge-crad", *state)
        assert (resumed.returncode, resumed.stdout) == (2, "")
        assert resumed.stderr == (
            "replicron: error: no replica has registered a job named 'charge-crad'; "
            "registered jobs: 'charge-card', 'nightly-cleanup'\n"
        )
        assert s.cluster_status().job("charge-crad") is None  # nothing was paused

        forced = run_cli("pause", "deploying-tomorrow", "--force", *state)
        assert forced.returncode == 0, forced.stderr
        assert forced.stdout.startswith("paused 'deploying-tomorrow'")
        again = run_cli("pause", "deploying-tomorrow", *state)  # a pause is known
        assert again.stdout == "'deploying-tomorrow' was paused already\n"
        resumed = run_cli("resume", "deploying-tomorrow", *state)
        assert resumed.stdout.startswith("resumed 'deploying-tomorrow'")
        assert run_cli("resume", "deploying-tomorrow", *state).returncode == 2

        known = run_cli("pause", "charge-card", *state)
        assert known.returncode == 0, known.stderr
        assert known.stdout.startswith("paused 'charge-card'")
        paused = s.cluster_status().job("charge-card")
        assert paused is not None
        assert paused.paused is not None


def test_pause_where_no_replica_registered_any_job_says_none_is(tmp_path: Path) -> None:
    s = Scheduler(clock=FakeClock(START), backend=EmbeddedBackend(tmp_path))
    s.start()
    s.shutdown()  # the ledger exists; no job was ever added
    refused = run_cli("pause", "charge-card", "--state-dir", str(tmp_path))
    assert refused.returncode == 2
    assert refused.stderr == (
        "replicron: error: no replica has registered a job named 'charge-card'; none is "
        "registered; to pause a job not deployed yet, add --force\n"
    )


def test_a_job_that_never_succeeded_reads_failed_in_the_cli_json_and_page(
    tmp_path: Path,
) -> None:
    # By the host's clock, so that nothing is overdue: the failure is the only thing to say.
    start = datetime.now(UTC).replace(microsecond=0)
    start -= timedelta(seconds=start.second % 10)
    clock = FakeClock(start)
    s = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path))
    s.add_job(every(seconds=10), broken, name="broken")
    with s:
        assert clock.wait_for_sleepers(1)
        clock.set(start + timedelta(seconds=10))
        s.wait_idle()
        table = run_cli("status", "--state-dir", str(tmp_path)).stdout.splitlines()
        status = json.loads(run_cli("status", "--state-dir", str(tmp_path), "--json").stdout)
        page = call(status_app(EmbeddedBackend(tmp_path))).text
    header = table[0]
    row = next(line for line in table if line.startswith("broken"))
    column = header.index("STATE")
    assert row[column:].split()[0] == "FAILED"
    assert [job["states"] for job in status["jobs"]] == [["FAILED"]]
    assert '<span class="badge bad">FAILED</span>' in page
