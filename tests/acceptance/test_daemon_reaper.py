"""The reaper that ends the command jobs' process groups when the daemon cannot: invisible
to the program (its signals, its output, its exit), and the end of every group when the
daemon dies or is frozen past a run's lease. The daemon's side runs in this process; the
daemon that dies or freezes is a stand-in (``daemon_scripts/stand_in.py``) running a
command job's task as the daemon does."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from replicron.context import RunContext, _current
from replicron.daemon import command
from replicron.daemon.command import CommandFailed, CommandTask
from tests._harness.daemons import Daemons, config_text
from tests._harness.reporting import report_on_failure
from tests.helpers import poll_until

STAND_IN = Path(__file__).resolve().parent / "daemon_scripts" / "stand_in.py"

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc is read"),
]


def run_command(argv: list[str], caplog: pytest.LogCaptureFixture) -> tuple[str | None, list[str]]:
    """Run a command job's task once here: its error (``None`` if it succeeded) and the
    lines of output the daemon logged."""

    async def run() -> str | None:
        _current.set(RunContext("job", datetime.now(UTC), 1, "test", None))
        try:
            await CommandTask("job", argv)()
        except CommandFailed as exc:
            return str(exc)
        return None

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="replicron.command"):
        error = asyncio.run(run())
    lines = [r.getMessage().split(" ", 1)[1] for r in caplog.records]
    said = [line.split("| ", 1)[1] for line in lines if line.startswith(("stdout|", "stderr|"))]
    return error, said


@pytest.fixture
def started_in_the_background() -> Iterator[None]:
    """This process as a script's ``command &`` starts it (SIGINT and SIGQUIT ignored), with
    SIGUSR1 blocked as well, for the test: the runs it starts must inherit neither. Set here
    so that the tests do not depend on how the suite itself was started."""
    ignored = {signum: signal.signal(signum, signal.SIG_IGN) for signum in QUIET}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for signum, handler in ignored.items():
            signal.signal(signum, handler)


QUIET = (signal.SIGINT, signal.SIGQUIT)


@pytest.mark.usefixtures("started_in_the_background")
def test_the_program_gets_default_signal_handling(caplog: pytest.LogCaptureFixture) -> None:
    # Python ignores SIGPIPE; an exec keeps what is ignored: `yes` would spin, or complain.
    script = "yes | head -1 >/dev/null; grep -E '^Sig(Blk|Ign)' /proc/self/status"
    error, said = run_command(["sh", "-c", script], caplog)
    assert error is None
    assert said == ["SigBlk:\t0000000000000000", "SigIgn:\t0000000000000000"]


@pytest.mark.usefixtures("started_in_the_background")
@pytest.mark.parametrize("name", ["HUP", "INT", "QUIT", "USR1", "USR2", "ALRM", "TERM"])
def test_a_signal_the_program_sends_its_group_is_for_the_program_alone(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    script = f"trap 'echo trapped' {name}; kill -{name} 0; sleep 0.2; echo after; exit 0"
    assert run_command(["sh", "-c", script], caplog) == (None, ["trapped", "after"])


def test_the_programs_exit_is_the_runs(caplog: pytest.LogCaptureFixture) -> None:
    assert run_command(["sh", "-c", "exit 3"], caplog)[0] == "exit status 3"
    assert run_command(["sh", "-c", "kill -SEGV $$"], caplog)[0] == "killed by SIGSEGV"
    missing = "exit status 127; stderr: cannot run '/no/such/program': No such file or directory"
    assert run_command(["/no/such/program"], caplog) == (missing, [missing.split(": ", 1)[1]])


def test_one_reaper_serves_every_run(caplog: pytest.LogCaptureFixture) -> None:
    run_command(["true"], caplog)
    reaper = command._REAPER.pid
    assert reaper is not None
    for _ in range(3):
        run_command(["true"], caplog)
    assert command._REAPER.pid == reaper
    assert command._REAPER._groups == {}  # each run's group was forgotten once gone


# ---- a stand-in daemon, killed or frozen ---------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


class StandIn:
    """A stand-in daemon running one command; what it printed, read as it comes."""

    def __init__(self, lease: str, renew: str, argv: list[str], log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(STAND_IN), lease, renew, *argv],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.said: dict[str, list[str]] = {}

    def wait_for(self, key: str, count: int = 1) -> list[str]:
        assert self.proc.stdout is not None
        while len(self.said.get(key, [])) < count:
            line = self.proc.stdout.readline()
            assert line, f"the stand-in ended before saying {key!r}"
            word, value = line.split(" ", 1)
            self.said.setdefault(word, []).append(value.strip())
        return self.said[key]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.log.close()


@pytest.fixture
def stand_ins(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[StandIn] = []
    groups: list[int] = []

    def start(lease: str, renew: str, *argv: str) -> tuple[StandIn, int]:
        stand_in = StandIn(lease, renew, list(argv), tmp_path / f"stand_in{len(made)}.log")
        made.append(stand_in)
        group = int(stand_in.wait_for("group")[0])
        groups.append(group)
        return stand_in, group

    yield start
    for stand_in in made:
        if stand_in.proc.poll() is None:
            os.kill(stand_in.proc.pid, signal.SIGCONT)
        stand_in.close()
    for group in groups:
        for pid in _group(group):
            os.kill(pid, signal.SIGKILL)


GRANDCHILD = "sleep 60 & echo started; wait"


def test_the_group_dies_with_the_daemon(stand_ins) -> None:  # type: ignore[no-untyped-def]
    stand_in, group = stand_ins("-", "-", "sh", "-c", GRANDCHILD)
    members = poll_until("the program and its child", lambda: len(_group(group)) == 2, 10)
    assert members
    stand_in.proc.kill()  # SIGKILL: the daemon can do nothing about it
    began = time.monotonic()
    poll_until("the whole group to die", lambda: not _group(group), 10)
    assert time.monotonic() - began < 5
    reaper = int(stand_in.wait_for("reaper")[0])
    poll_until("the reaper to end", lambda: not _alive(reaper), 10)


def test_a_reaper_killed_by_hand_is_replaced(stand_ins) -> None:  # type: ignore[no-untyped-def]
    stand_in, group = stand_ins("-", "-", "sh", "-c", GRANDCHILD)
    poll_until("the program and its child", lambda: len(_group(group)) == 2, 10)
    first = int(stand_in.wait_for("reaper")[0])
    os.kill(first, signal.SIGKILL)
    # The daemon notices within a lease feed and starts another, told of the group.
    replaced = poll_until(
        "a new reaper",
        lambda: [p for p in _children(stand_in.proc.pid) if p != first and _alive(p)],
        10,
    )
    assert _group(group)
    time.sleep(0.5)  # (a real-time test) the new reaper has read what it was told
    stand_in.proc.kill()
    poll_until("the whole group to die", lambda: not _group(group), 10)
    assert replaced


def _children(parent: int) -> list[int]:
    path = Path(f"/proc/{parent}/task/{parent}/children")
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def test_a_frozen_daemons_group_dies_at_the_leases_end(stand_ins) -> None:  # type: ignore[no-untyped-def]
    """A heartbeat renews the lease 1 s in (to 2 s from then); the daemon is then frozen
    and can neither renew it again nor stop the run: the reaper kills the group at the
    renewed end by itself."""
    stand_in, group = stand_ins("2", "1", "sh", "-c", GRANDCHILD)
    first, renewed = (float(end) for end in stand_in.wait_for("lease", 2))
    assert renewed > first
    time.sleep(0.5)  # (a real-time test) the renewed end has reached the reaper
    os.kill(stand_in.proc.pid, signal.SIGSTOP)
    assert _group(group), "the group died before its lease's end"
    poll_until("the whole group to die", lambda: not _group(group), 10, every=0.01)
    ended = time.monotonic()
    assert renewed <= ended < renewed + 1.0, (ended - first, ended - renewed)


# ---- a real daemon, frozen ------------------------------------------------------------------

STOP_AWARE = STAND_IN.with_name("stop_aware.py")


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_frozen_daemons_command_dies_at_its_leases_end(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    dsn: str,
    coordination: str,
    summary: Callable[[str], None],
) -> None:
    """A daemon on PostgreSQL (heartbeat 1 s, stale_after 4 s: its runs' lease ends 3 s after
    the last heartbeat sent) is frozen mid-run: its reaper kills the command's group (the
    program and a grandchild that ignore SIGTERM) by the lease's end, before any other
    replica may take the job over, although the daemon can do nothing."""
    daemons = Daemons(tmp_path)
    report_on_failure(request, "daemon logs", daemons.logs)
    said = tmp_path / "said.jsonl"
    settings = {
        "database_url": dsn,
        "namespace": f"frozen-{coordination}",
        "coordination": coordination,
        "replica_id": "frozen",
        "heartbeat_interval": "1s",
        "stale_after": "4s",
        "stop_timeout": "5s",
    }
    job = {
        "name": "long",
        "every": "1s",
        "max_runs": 1,
        "command": [sys.executable, str(STOP_AWARE), str(said), "ignore"],
    }
    try:
        daemon = daemons.start("frozen", config_text(settings, [job]))
        started = poll_until("the run to start", lambda: _said(said).get("started"), 30)
        program, grandchild = int(str(started["pid"])), int(str(started["child"]))
        time.sleep(2.5)  # (a real-time test) a few heartbeats renew the lease
        daemon.pause()
        frozen = time.monotonic()
        poll_until(
            "the program and its grandchild to die",
            lambda: not (_alive(program) or _alive(grandchild)),
            15,
            every=0.01,
        )
        died = time.monotonic() - frozen
        # The last heartbeat was sent at most 1 s (and a statement's time) before the freeze.
        assert 1.5 <= died <= 3.0 + 1.0, died
        summary(f"{coordination} mode, daemon frozen mid-run: its command died {died:.2f} s later")
        daemon.resume()
        daemon.wait_log("abandoned", 20)
        code, _ = daemon.stop(20)
        assert code == 0, daemon.log()
    finally:
        daemons.close()


def _said(path: Path) -> dict[str, dict[str, object]]:
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return {str(line["event"]): line for line in lines}
