"""A throwaway PostgreSQL cluster for the tests, for when no server is named.

    python tools/temp_postgres.py start DIR OWNER_PID   # prints the cluster's DSN
    python tools/temp_postgres.py stop DIR              # stops it and removes DIR

``start`` makes a cluster in ``DIR`` (an empty directory) with the newest server binaries it
finds (``/usr/lib/postgresql/*/bin``, else ``initdb`` on PATH): trust authentication,
listening on 127.0.0.1 on a free port, its socket in ``DIR``, no fsync. It prints the DSN
on stdout, and one line on stderr saying where the tests' database runs. PostgreSQL refuses
to run as root: as root, ``DIR`` is handed to the OS user postgres and the server programs
run as that user. Without server binaries (or as root without a postgres user) it prints
one line saying why the PostgreSQL tests are skipped and nothing on stdout.

``stop`` is safe on any ``DIR`` that ``start`` was given, whatever state it was left in.
``start`` first stops the clusters of earlier runs whose ``OWNER_PID`` is gone (killed
before they could stop their own).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

SERVER_DIRS = "/usr/lib/postgresql/*/bin"
PREFIX = "replicron-test-pg."  # DIR's name starts with it (stale clusters are found by it)
SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}
PORT_ATTEMPTS = 3


class Skip(Exception):
    """No cluster can be made here; the message says why."""


def main() -> int:
    parser = argparse.ArgumentParser(description="A throwaway PostgreSQL cluster for the tests")
    commands = parser.add_subparsers(dest="command", required=True)
    start_cmd = commands.add_parser("start")
    start_cmd.add_argument("dir", type=Path)
    start_cmd.add_argument("owner_pid", type=int)
    stop_cmd = commands.add_parser("stop")
    stop_cmd.add_argument("dir", type=Path)
    args = parser.parse_args()
    if args.command == "stop":
        stop(args.dir)
        return 0
    for stale in stale_clusters(args.dir):
        stop(stale)
    try:
        dsn = start(args.dir, args.owner_pid)
    except Skip as why:
        print(f"PostgreSQL tests are skipped: {why}", file=sys.stderr)
        return 0
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"cannot start a throwaway PostgreSQL cluster: {exc}", file=sys.stderr)
        return 1
    print(dsn)
    return 0


def start(workdir: Path, owner_pid: int) -> str:
    bindir = server_bindir()
    if bindir is None:
        raise Skip(
            f"REPLICRON_TEST_DSN is not set and no PostgreSQL server binaries (initdb, pg_ctl) "
            f"were found in {SERVER_DIRS} or on PATH"
        )
    user = server_user()
    (workdir / "owner").write_text(f"{owner_pid}\n")
    (workdir / "bindir").write_text(f"{bindir}\n")
    if user is not None:
        os.chown(workdir, user.pw_uid, user.pw_gid)
    data = workdir / "data"
    run(
        user,
        workdir,
        bindir / "initdb",
        "-D",
        data,
        "-U",
        "postgres",
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    )
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\n# a throwaway cluster for replicron's tests (tools/temp_postgres.py)\n")
        conf.writelines(f"{key} = {value}\n" for key, value in SETTINGS.items())
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        options = f"-p {port} -h 127.0.0.1 -k '{workdir}'"
        try:
            run(
                user,
                workdir,
                bindir / "pg_ctl",
                "-D",
                data,
                "-l",
                workdir / "postgres.log",
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            )
        except subprocess.CalledProcessError:
            if attempt == PORT_ATTEMPTS:
                log = workdir / "postgres.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"the throwaway cluster did not start:\n{tail}") from None
            continue  # someone took the port meanwhile
        break
    print(
        f"PostgreSQL tests run on a throwaway cluster at 127.0.0.1:{port} ({bindir}, in "
        f"{workdir}), removed afterwards",
        file=sys.stderr,
    )
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def stop(workdir: Path) -> None:
    """Stop the cluster in ``workdir`` at once (nothing of it is kept) and remove ``workdir``."""
    pidfile = workdir / "data" / "postmaster.pid"
    bindir_file = workdir / "bindir"
    if pidfile.exists() and bindir_file.exists():
        bindir = Path(bindir_file.read_text().strip())
        with contextlib.suppress(subprocess.CalledProcessError, OSError, Skip):
            run(
                server_user(),
                workdir,
                bindir / "pg_ctl",
                "-D",
                workdir / "data",
                "-m",
                "immediate",
                "-w",
                "-t",
                "30",
                "stop",
            )
    if pidfile.exists():  # pg_ctl could not stop it: the postmaster goes, its children follow
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
    shutil.rmtree(workdir, ignore_errors=True)


def stale_clusters(workdir: Path) -> list[Path]:
    """Directories of earlier runs beside ``workdir`` whose owner process is gone."""
    stale = []
    for path in workdir.parent.glob(f"{PREFIX}*"):
        if path == workdir or not path.is_dir():
            continue
        try:
            owner = int((path / "owner").read_text())
        except (OSError, ValueError):
            continue  # not started by start(), or still being started
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            stale.append(path)
        except PermissionError:
            pass  # alive, another user's
    return stale


def server_bindir() -> Path | None:
    """The directory of the newest server binaries (initdb and pg_ctl), if any."""
    found = []
    for initdb in Path("/").glob(f"{SERVER_DIRS.lstrip('/')}/initdb"):
        version = initdb.parent.parent.name
        if (initdb.parent / "pg_ctl").exists():
            with contextlib.suppress(ValueError):
                found.append((tuple(int(part) for part in version.split(".")), initdb.parent))
    if found:
        return max(found)[1]
    initdb_path = shutil.which("initdb")
    if initdb_path is not None and shutil.which("pg_ctl") is not None:
        return Path(initdb_path).parent
    return None


def server_user() -> pwd.struct_passwd | None:
    """The OS user to run the server as: postgres when root (None: the current user)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise Skip("running as root, and there is no postgres user to run the server") from None


def run(user: pwd.struct_passwd | None, cwd: Path, *command: str | Path) -> None:
    """Run a server program (as ``user``, if given); its output is shown only if it fails."""
    result = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        user=None if user is None else user.pw_uid,
        group=None if user is None else user.pw_gid,
        extra_groups=None if user is None else [],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise subprocess.CalledProcessError(result.returncode, command)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(main())
