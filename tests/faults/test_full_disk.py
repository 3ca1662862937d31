"""The embedded backend on a full disk: a daemon (``replicron run``, its state directory the
default ``.replicron`` in its working directory) whose state directory is a small tmpfs of the
test's own, filled with a file while a run is going and freed again.

What is checked comes from outside the daemon: the ledger, what the job's command wrote (one
line per run, outside the tmpfs), the daemon's log and exit status.
"""

from __future__ import annotations

import errno
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from replicron.backends.embedded import LEDGER_NAME
from tests._harness.daemons import Daemons, config_text
from tests._harness.reporting import report_on_failure
from tests.faults.prereqs import require
from tests.helpers import embedded_rows

pytestmark = pytest.mark.timeout(60)

Summary = Callable[[str], None]
JOB = "tick"


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (created), unmounted afterwards."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Write a file on ``disk`` until no byte more fits; the file."""
    filler = disk / "filler"
    chunk = b"\0" * 4096
    with filler.open("wb", buffering=0) as out:
        while _wrote(out, chunk):
            pass
    return filler


def _wrote(out: BinaryIO, chunk: bytes) -> bool:
    """Whether ``chunk`` fitted; False once there is no space left."""
    try:
        out.write(chunk)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return False
    return True


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The daemons' default state directory, ``.replicron`` in their working directory: a
    3 MiB tmpfs (the ledger, its WAL of at most 1 MiB, and room for the filler to take)."""
    require("root")
    with small_disk(tmp_path / ".replicron", "3m") as disk:
        yield disk


@pytest.fixture
def daemons(request: pytest.FixtureRequest, state_dir: Path, tmp_path: Path) -> Iterator[Daemons]:
    """The test's daemons, stopped before their state directory is unmounted."""
    with closing(Daemons(tmp_path)) as found:
        report_on_failure(request, "daemon logs", found.logs)
        yield found


def config(out: Path) -> str:
    """One job each second whose run takes half a second and appends its tick to ``out``."""
    script = 'sleep 0.5; echo "$REPLICRON_SCHEDULED_AT $REPLICRON_RUN_ID" >> "$1"'
    job = {"name": JOB, "every": "1s", "command": ["sh", "-c", script, "record", str(out)]}
    return config_text({}, [job])


def rows(state_dir: Path) -> list[dict[str, Any]]:
    return embedded_rows(state_dir, JOB)


def going(state_dir: Path) -> dict[str, Any] | None:
    """A run under way: started, no outcome yet."""
    found = [r for r in rows(state_dir) if r["started_at"] is not None and r["outcome"] is None]
    return found[0] if found else None


def ran(out: Path, run_id: int) -> bool:
    """Whether the command of run ``run_id`` wrote its line."""
    return out.exists() and any(line.split()[1:] == [str(run_id)] for line in lines(out))


def lines(out: Path) -> list[str]:
    return [line for line in out.read_text().splitlines(keepends=True) if line.endswith("\n")]


def test_a_run_that_ends_on_a_full_disk_is_recorded_and_the_job_runs_on(
    daemons: Daemons, state_dir: Path, tmp_path: Path, summary: Summary
) -> None:
    out = tmp_path / "runs.txt"
    daemon = daemons.start("d1", config(out))
    run = daemons.wait_until("a run to be under way", lambda: going(state_dir), 20.0)
    filler = fill(state_dir)
    daemons.wait_until("the run to end on the full disk", lambda: ran(out, run["run_id"]), 5.0)
    time.sleep(1.0)  # the fault goes on: later ticks fall due on the full disk
    filler.unlink()
    freed = datetime.now(UTC)
    daemons.wait_until(
        "a tick after the disk was freed to succeed",
        lambda: any(
            r["outcome"] == "succeeded" and r["scheduled_at"] > freed for r in rows(state_dir)
        ),
        10.0,
    )
    assert daemons.stop()["d1"] == 0

    ledger = rows(state_dir)
    outcomes = Counter(r["outcome"] for r in ledger)
    [kept] = [r for r in ledger if r["run_id"] == run["run_id"]]
    assert kept["outcome"] == "succeeded", kept
    assert outcomes["abandoned"] == 0, ledger
    assert outcomes[None] == 0, ledger
    ticks = [r["scheduled_at"] for r in ledger]
    every_tick = [ticks[0] + timedelta(seconds=n) for n in range(len(ticks))]
    assert ticks == every_tick, "a tick without a row"
    runs = Counter(datetime.fromisoformat(line.split()[0]) for line in lines(out))
    assert max(runs.values()) == 1, "a tick ran twice"
    succeeded = {r["scheduled_at"] for r in ledger if r["outcome"] == "succeeded"}
    assert set(runs) == succeeded
    assert any(tick > freed for tick in succeeded)
    # One line when the outcome could not be written, one when it was.
    [waiting] = daemon.lines("outcomes waiting to be written")
    assert "the disk is full (no space left on device)" in waiting
    assert len(daemon.lines("outcomes that waited are written")) == 1
    summary(
        f"[full disk, embedded] {len(ledger)} ticks, {dict(outcomes)}; run {run['run_id']}"
        " recorded succeeded once the disk was freed"
    )


@pytest.mark.parametrize("ledger", ["new", "existing"])
def test_a_daemon_starting_on_a_full_disk_says_the_disk_is_full(
    daemons: Daemons, state_dir: Path, tmp_path: Path, ledger: str
) -> None:
    if ledger == "existing":
        daemons.start("d0", config(tmp_path / "runs.txt")).wait_log("scheduler started")
        assert daemons.stop()["d0"] == 0
    fill(state_dir)
    daemon = daemons.start("d1", config(tmp_path / "runs.txt"))
    assert daemon.wait_exit(20.0) != 0
    problems = [line for line in daemon.log().splitlines() if str(state_dir) in line]
    assert len(problems) == 1, daemon.log()
    assert "the disk is full (no space left on device)" in problems[0]
    assert "Traceback" not in daemon.log()
    if ledger == "new":  # nothing left behind by a start that could not write a byte
        assert not (state_dir / LEDGER_NAME).exists()
