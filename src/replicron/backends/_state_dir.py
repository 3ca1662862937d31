"""The embedded backend's state directory: created if need be, and checked before use."""

from __future__ import annotations

import os
from pathlib import Path

from replicron.errors import StateDirError

__all__ = ["LEDGER_NAME", "prepare_locks_dir", "prepare_state_dir"]

LEDGER_NAME = "replicron.sqlite3"


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
