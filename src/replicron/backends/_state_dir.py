"""The embedded backend's state directory: created if need be, and checked before use."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from replicron.errors import StateDirError

__all__ = [
    "DISK_FULL",
    "LEDGER_NAME",
    "out_of_space",
    "prepare_locks_dir",
    "prepare_state_dir",
    "problem_of",
]

LEDGER_NAME = "replicron.sqlite3"

#: SQLite's primary result codes (an extended code keeps its primary one in the low byte).
_SQLITE_IOERR, _SQLITE_FULL = 10, 13
#: Less free space than this on the state directory's filesystem is a full disk: SQLite needs
#: a few pages for any write.
_ROOM_NEEDED = 64 * 1024
#: What a full disk is called in every message about it.
DISK_FULL = "the disk is full (no space left on device)"


def out_of_space(exc: BaseException, directory: Path) -> bool:
    """Whether ``exc`` failed for want of disk space on ``directory``'s filesystem. SQLite
    reports a write to its shared-memory file that finds no room as an I/O error, so that one
    is told apart by the space left."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not isinstance(exc, sqlite3.OperationalError):  # SQLite's own failures carry its code
        return False
    if exc.sqlite_errorcode & 0xFF == _SQLITE_FULL:
        return True
    if exc.sqlite_errorcode & 0xFF != _SQLITE_IOERR:
        return False
    try:
        stats = os.statvfs(directory)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < _ROOM_NEEDED


def problem_of(exc: BaseException, directory: Path) -> str:
    """What went wrong, in one line: a full disk said so, whatever SQLite called it."""
    if out_of_space(exc, directory):
        return DISK_FULL
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def prepare_state_dir(path: Path) -> Path:
    """Create the state directory if needed and check it can be used; its real path."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise StateDirError(path, "exists and is not a directory") from exc
    except OSError as exc:
        raise StateDirError(path, f"cannot be created: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateDirError(path, "is not writable by this process")
    ledger = path / LEDGER_NAME
    if ledger.exists() and not ledger.is_file():
        raise StateDirError(ledger, "is not a regular file")
    if ledger.exists() and not os.access(ledger, os.R_OK | os.W_OK):
        raise StateDirError(ledger, "is not readable and writable by this process")
    return Path(os.path.realpath(path))


def prepare_locks_dir(path: Path) -> None:
    """Create the lock directory and check that ``flock`` works in it (it does not on some
    network filesystems, and a lock that does nothing would let runs overlap)."""
    import fcntl  # POSIX only; the constructor refused other systems

    try:
        path.mkdir(exist_ok=True)
        fd = os.open(path / ".probe", os.O_RDWR | os.O_CREAT, 0o644)
    except FileExistsError as exc:
        raise StateDirError(path, "exists and is not a directory") from exc
    except OSError as exc:
        raise StateDirError(path, f"cannot hold lock files: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        pass  # another process is probing at this moment: locks work
    except OSError as exc:
        raise StateDirError(
            path, f"file locks do not work here ({exc.strerror or exc}): use a local filesystem"
        ) from exc
    finally:
        os.close(fd)
