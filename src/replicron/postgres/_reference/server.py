"""The server's side of a session that the SQL reads: which server session a statement runs
on (``pg_backend_pid()``, ``replicron.session_token``) and the session advisory locks each
holds (``pg_locks``, as ``replicron_advisory_locks()`` reads them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["AdvisoryLocks", "ServerSession"]


@dataclass
class ServerSession:
    """One server session (a backend process): its pid and its settings."""

    pid: int
    settings: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    def is_ours(self, pid: object, session_token: object) -> bool:
        """The lock session check of the advisory statements: the statement runs on the
        server session its replica set up (``pg_backend_pid() = %(pid)s AND
        current_setting('replicron.session_token', true) = %(session_token)s``)."""
        return self.pid == pid and self.settings.get("replicron.session_token") == session_token


@dataclass
class AdvisoryLocks:
    """Session advisory locks in the jobs' (one bigint) key space: re-entrant per session,
    exclusive across sessions, gone with their session; not undone by a statement's error."""

    held: dict[int, Counter[int]] = field(default_factory=dict)  # pid -> key -> times taken

    def try_lock(self, session: ServerSession, key: int) -> bool:
        for pid, keys in self.held.items():
            if pid != session.pid and keys[key] > 0:
                return False
        self.held.setdefault(session.pid, Counter())[key] += 1
        return True

    def unlock(self, session: ServerSession, key: int) -> bool:
        keys = self.held.get(session.pid)
        if keys is None or keys[key] <= 0:
            return False  # the server warns "you don't own a lock of type ExclusiveLock"
        keys[key] -= 1
        if keys[key] == 0:
            del keys[key]
        return True

    def holders(self) -> dict[int, int]:
        """Every key held, and the pid that holds it."""
        return {key: pid for pid, keys in self.held.items() for key, times in keys.items() if times}

    def held_by(self, session: ServerSession) -> list[int]:
        return sorted(key for key, times in self.held.get(session.pid, Counter()).items() if times)

    def is_held(self, pid: int | None, key: int | None) -> bool:
        """Whether ``(pid, key)`` is among ``replicron_advisory_locks()``."""
        if pid is None or key is None:
            return False
        return self.held.get(pid, Counter())[key] > 0

    def session_ended(self, session: ServerSession) -> None:
        self.held.pop(session.pid, None)
