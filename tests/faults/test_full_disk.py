"""The embedded backend on a full disk: a daemon (``replicron run``, its state directory the
default ``.replicron`` in its working directory) whose state directory is a small tmpfs of the
test's own, filled with a file while a run is going and freed again.

What is checked comes from outside the daemon: the ledger, what the job's command wrote (one
line per run, outside the tmpfs), the daemon's log and exit status.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest

from tests._harness.daemons import Daemons, config_text
from tests._harness.reporting import report_on_failure
from tests.faults.prereqs import require

pytestmark = pytest.mark.timeout(60)

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
