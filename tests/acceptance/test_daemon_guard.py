"""The guard that leads a command's process group: invisible to the program (its signals,
its exit), and the end of the whole group when the daemon dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import replicron.daemon.command as command_module
from tests.helpers import poll_until

GUARD = Path(command_module.__file__).with_name("_guard.py")

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
]


def guarded(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``sh -c script`` under the guard, as the daemon does (a session of its own)."""
    argv = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), "-", "sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, start_new_session=True)


def test_the_program_gets_default_signal_handling() -> None:
    # Python ignores SIGPIPE; an exec keeps what is ignored: `yes` would spin, or complain.
    done = guarded("yes | head -1 >/dev/null; grep SigIgn /proc/self/status")
    assert done.returncode == 0
    assert done.stderr == ""
    assert done.stdout.split() == ["SigIgn:", "0000000000000000"]


@pytest.mark.parametrize("name", ["HUP", "INT", "USR1", "USR2", "ALRM", "TERM"])
def test_a_signal_the_program_sends_its_group_is_for_the_program_alone(name: str) -> None:
    done = guarded(f"trap 'echo trapped' {name}; kill -{name} 0; sleep 0.2; echo after; exit 0")
    assert (done.returncode, done.stdout.split()) == (0, ["trapped", "after"]), done.stderr


def test_the_programs_exit_is_the_guards() -> None:
    assert guarded("exit 3").returncode == 3
    assert guarded("kill -SEGV $$").returncode == -signal.SIGSEGV
    missing = guarded("exec /no/such/program")
    assert missing.returncode == 127


def test_a_missing_program_says_so() -> None:
    argv = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), "-", "/no/such/program"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 127
    assert "cannot run '/no/such/program': No such file or directory" in done.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_the_group_and_a_child_that_left_it_die_with_the_daemon(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # A stand-in for the daemon: it starts the guard, reports its pid, and waits to be killed.
    # The program starts a grandchild in its group and moves itself to a group of its own,
    # as GNU timeout does.
    program = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        "os.setpgid(0, 0)\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n"
    )
    daemon = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-I', '-S', {str(GUARD)!r}, str(os.getpid()), '-',"
        f" sys.executable, '-c', {program!r}], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    stand_in = subprocess.Popen([sys.executable, "-c", daemon])
    try:
        found = poll_until("the program's pids", lambda: pids.exists() and pids.read_text(), 20)
        moved, grandchild = (int(pid) for pid in str(found).split())
        assert _alive(moved)
        assert _alive(grandchild)
    finally:
        stand_in.kill()
        stand_in.wait(10)
    began = time.monotonic()
    poll_until(
        "the program and its grandchild to die",
        lambda: not (_alive(moved) or _alive(grandchild)) or None,
        10,
    )
    assert time.monotonic() - began < 10


def test_the_group_dies_at_the_leases_end_unless_it_was_renewed() -> None:
    """The daemon writes each new end of the run's lease to the guard; a daemon frozen past it
    writes nothing more, and the guard kills the group at that end by itself."""
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), str(read_end), "sleep", "60"]
    guard = subprocess.Popen(argv, pass_fds=(read_end,), start_new_session=True)
    os.close(read_end)
    try:
        first_end = time.monotonic() + 1.0
        os.write(write_end, f"{first_end!r}\n".encode())
        renewed_end = time.monotonic() + 3.0
        os.write(write_end, f"{renewed_end!r}\n".encode())  # a heartbeat got through
        status = guard.wait(20)
        ended = time.monotonic()
    finally:
        os.close(write_end)
        guard.kill()
    assert status == -signal.SIGKILL
    assert renewed_end <= ended < renewed_end + 2.0, (ended - first_end, ended - renewed_end)
    poll_until("the whole group to go", lambda: not _group_alive(guard.pid) or None, 10)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
