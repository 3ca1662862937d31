"""What the fault-injection suite needs from the machine, and what happens when it is missing.

The suite runs real faults: a network namespace with nftables rules, PostgreSQL clusters
started with ``initdb``/``pg_ctl`` as the OS user ``postgres``, pgbouncer, and libfaketime.
That needs root and a few Debian packages. On a developer's machine without them the tests
skip with the reason; under CI (``CI`` set) they fail instead, so that a broken CI image
cannot silently turn the suite into a row of skips.
"""

from __future__ import annotations

import functools
import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

from tests._harness import machine

__all__ = [
    "libfaketime_path",
    "postgres_bin",
    "require",
    "unavailable",
]

#: Where Debian's PostgreSQL packages put initdb, pg_ctl and postgres.
_POSTGRES_BINS = "/usr/lib/postgresql/*/bin"
_FAKETIME_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it under CI."""
    machine.unavailable(f"fault-injection suite: {reason}")


@functools.cache
def postgres_bin() -> Path | None:
    """The newest PostgreSQL server bin directory with initdb, or None."""
    candidates = [Path(p) for p in glob.glob(_POSTGRES_BINS) if Path(p, "initdb").exists()]
    if not candidates:
        return None
    return max(candidates, key=lambda p: _version_key(p.parent.name))


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


@functools.cache
def libfaketime_path() -> Path | None:
    """The libfaketime preload library: a known location, else what dpkg says."""
    for pattern in _FAKETIME_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return Path(found[0])
    if shutil.which("dpkg"):
        listing = subprocess.run(
            ["dpkg", "-L", "libfaketime"], capture_output=True, text=True, check=False
        ).stdout
        for line in listing.splitlines():
            if line.endswith("/libfaketime.so.1"):
                return Path(line)
    return None


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _missing(what: str) -> str | None:
    """Why ``what`` is unavailable, or None when it is there."""
    if what == "root":
        return None if os.geteuid() == 0 else "needs root (network namespaces, runuser)"
    if what in ("ip", "nft", "runuser"):
        return None if shutil.which(what) else f"`{what}` is not installed"
    if what == "pgbouncer":
        return None if shutil.which("pgbouncer") else "pgbouncer is not installed"
    if what == "libfaketime":
        return None if libfaketime_path() else "libfaketime is not installed"
    if what == "initdb":
        return None if postgres_bin() else f"no PostgreSQL initdb under {_POSTGRES_BINS}"
    if what == "pg_basebackup":  # with the server binaries (a streaming standby)
        bindir = postgres_bin()
        found = bindir is not None and (bindir / "pg_basebackup").exists()
        return None if found else "pg_basebackup is not installed beside initdb"
    if what == "postgres-user":
        return None if _has_user("postgres") else "there is no OS user `postgres`"
    raise ValueError(f"unknown prerequisite {what!r}")


def require(*what: str) -> None:
    """Skip (or under CI, fail) unless every named prerequisite is present: "root", "ip",
    "nft", "runuser", "pgbouncer", "libfaketime", "initdb", "pg_basebackup", "postgres-user"."""
    reasons = [reason for item in what if (reason := _missing(item)) is not None]
    if reasons:
        unavailable("; ".join(reasons))
