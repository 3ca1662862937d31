"""`replicron next`, run as a real process (the console script) and in-process; how
`replicron status` prints a status."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from replicron._cli_status import print_status
from replicron.cli import main
from replicron.cluster import JobStatus, Registration, ReplicaStatus, build_status
from tests.helpers import z

REPLICRON = [sys.executable, "-m", "replicron.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REPLICRON, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_next_prints_instants_in_the_zone() -> None:
    result = run(
        "next", "30 2 * * *", "--tz", "America/New_York", "-n", "3", "--after", "2026-03-07"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]
    assert result.stderr == ""


def test_next_with_seconds_and_an_aware_after(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "next",
                "*/20 * * * * *",
                "--seconds",
                "-n",
                "2",
                "--after",
                "2026-01-01T00:00:05+02:00",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        "2025-12-31T22:00:20+00:00",
        "2025-12-31T22:00:40+00:00",
    ]


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "replicron"
    result = subprocess.run(
        [str(script), "next", "@yearly", "-n", "1", "--after", "2026-06-01T00:00:00Z"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "2027-01-01T00:00:00+00:00\n"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["next", "60 * * * *"], "'60' is out of range 0-59 in the minute field"),
        (["next", "0 * * * *", "--tz", "Mars/Base"], "unknown time zone 'Mars/Base'"),
        (["next", "0 * * * *", "--after", "yesterday"], "--after 'yesterday' is not"),
        (["next", "0 * * * *", "-n", "0"], "-n must be at least 1"),
        (["next", "0 * * * *", "-n", "many"], "invalid int value"),
        (["next"], "the following arguments are required: expression"),
        (["frobnicate"], "invalid choice"),
        (["next", "@reboot"], "@reboot is not supported"),
    ],
)
def test_invalid_input_gives_one_line_and_status_2(args: list[str], fragment: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("replicron")
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["-m", "replicron"], ["-m", "replicron.cli"]])
def test_the_version_and_a_help_written_for_people(command: list[str]) -> None:
    import replicron

    version = subprocess.run(
        [sys.executable, *command, "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout == f"replicron {replicron.__version__}\n"
    helped = subprocess.run(
        [sys.executable, *command, "--help"], capture_output=True, text=True, check=True
    )
    assert "Scheduled jobs run exactly once across replicas" in helped.stdout
    assert "``" not in helped.stdout  # no docstring markup


def test_status_notes_and_check_word_each_problem_alike(capsys: pytest.CaptureFixture[str]) -> None:
    """The table's notes and ``--check`` print the status's problems in the same words; the
    table adds what else to know (a failed run's error) and leaves out what its row says."""
    now = z(2026, 6, 1, 12)
    tick = now - timedelta(minutes=10)
    rows = [
        JobStatus(
            "broken",
            "r1",
            tick,
            tick,
            tick,
            "failed",
            "RuntimeError: disk full",
            None,
            (),
            0,
            (("r2", 7),),
            tick,
        ),
        JobStatus(
            "crowded",
            "r1",
            tick,
            None,
            None,
            "skipped_overlap",
            "still running",
            tick,
            (),
            0,
            (),
            tick,
        ),
    ]
    registrations = [
        Registration(
            job,
            replica,
            "every(minutes=5)",
            fingerprint,
            timedelta(minutes=1),
            (now + timedelta(minutes=1),),
            now,
            True,
        )
        for job, replica, fingerprint in [
            ("broken", "r1", "a"),
            ("broken", "r2", "b"),
            ("crowded", "r1", "a"),
        ]
    ]
    replicas = [ReplicaStatus(name, None, None, now, now, True) for name in ("r1", "r2")]
    status = build_status("", now, rows, registrations, [], replicas)

    assert print_status(status, {}, as_json=False, check=True) == 1
    assert capsys.readouterr().out.splitlines() == status.problems()
    assert print_status(status, {}, as_json=False, check=False) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[-2:] == ["FAILED,BLOCKED,DRIFT", "0"]
    assert table[2].split()[-2:] == ["ok", "0"]
    drift, failed, blocked = status.problems()
    assert failed.startswith("broken: last run failed")
    assert table[3:6] == [drift, blocked, "broken: last error: RuntimeError: disk full"]
    assert table[6] == ""  # no note of crowded: a skipped tick's detail is no run's error
