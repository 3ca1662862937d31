"""The embedded backend's run locks: a file per lock key, locked with ``flock`` (through
:mod:`filelock`) without ever waiting; the kernel drops a lock with the process holding it.

A process must not take a lock it holds already: ``filelock`` locks re-enter, and where the
system emulates ``flock`` with ``fcntl`` locks (NFS, some Unixes) the handles of one process
are not kept apart. So every lock file held by any handle of this process is also noted in one
in-process set.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = ["FileLocks", "release", "try_hold"]

_MASK64 = (1 << 64) - 1

#: Lock files held by any handle in this process.
_process_held: set[str] = set()
_process_guard = threading.Lock()


@dataclass(slots=True)
class _LockFile:
    path: str
    lock: FileLock
    #: The run holding it through this handle; None while it is free.
    run_id: int | None = None


class FileLocks:
    """The run locks of one backend handle, in ``directory``, by lock key."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[int, _LockFile] = {}

    def path(self, key: int) -> Path:
        """The lock file of ``key``: the key as 16 hex digits."""
        return self.directory / f"{key & _MASK64:016x}.lock"

    def holder(self, key: int) -> int | None:
        """The run id holding ``key`` through this handle, if any."""
        held = self._files.get(key)
        return None if held is None else held.run_id

    def try_lock(self, key: int, run_id: int) -> bool:
        """Take the lock for ``run_id`` without waiting, unless a handle of this process (this
        one included) has it."""
        import filelock  # on first use: importing it costs other backends' users ~30 ms

        if self.holder(key) is not None:
            return False
        path = str(self.path(key))
        held = self._files.get(key)
        if held is None:
            lock = filelock.FileLock(path, timeout=0, thread_local=False)
            held = self._files[key] = _LockFile(path, lock)
        if not try_hold(held.path, held.lock):
            return False
        held.run_id = run_id
        return True

    def unlock(self, key: int) -> None:
        held = self._files.get(key)
        if held is None:
            return
        held.run_id = None
        release(held.path, held.lock)

    def unlock_all(self) -> None:
        """Drop every lock this handle holds, and its lock objects."""
        for key, held in list(self._files.items()):
            if held.run_id is not None:
                self.unlock(key)
        self._files.clear()


def try_hold(path: str, lock: FileLock) -> bool:
    """Take ``lock`` (the file at ``path``) without waiting, unless a handle of this process
    has it."""
    import filelock

    with _process_guard:
        if path in _process_held:
            return False
        _process_held.add(path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        _forget(path)
        return False
    except BaseException:
        _forget(path)
        raise
    return True


def release(path: str, lock: FileLock) -> None:
    """Drop ``lock``, held through :func:`try_hold`."""
    try:
        lock.release(force=True)
    finally:
        _forget(path)


def _forget(path: str) -> None:
    with _process_guard:
        _process_held.discard(path)
