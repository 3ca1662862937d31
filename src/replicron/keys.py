"""Job and replica identity: names validated, and the advisory-lock key derived from a name."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable

from .errors import (
    ArgumentTypeError,
    ConfigurationError,
    InvalidJobNameError,
    InvalidJobOptionError,
    LockKeyCollisionError,
)

__all__ = ["MAX_JOB_NAME_LENGTH", "LockKeyRegistry", "check_job_name", "job_lock_key"]

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF
MAX_JOB_NAME_LENGTH = 200


def job_lock_key(name: str) -> int:
    """FNV-1a 64 of the UTF-8 bytes of ``name``, as a *signed* 64-bit integer.

    Byte-compatible with Go's ``int64(fnv.New64a().Sum64())``, so Go and Python services
    sharing a PostgreSQL lock the same key. Signed because PostgreSQL's advisory-lock
    functions take a ``bigint``.
    """
    if not isinstance(name, str):
        raise ArgumentTypeError(f"job name must be a str, not {type(name).__name__}")
    return _fnv1a64_signed(name)


# Backends ask for a job's key on every claim and release; the hash is a Python loop over
# the name's bytes, so each name is hashed once.
@functools.lru_cache(maxsize=65536)
def _fnv1a64_signed(name: str) -> int:
    value = _FNV64_OFFSET
    for byte in name.encode("utf-8"):
        value = ((value ^ byte) * _FNV64_PRIME) & _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def check_job_name(name: object) -> str:
    """Return ``name`` if it can identify a job across replicas, else raise
    :class:`InvalidJobNameError` saying why."""
    if not isinstance(name, str):
        raise InvalidJobNameError(f"job name must be a str, not {type(name).__name__}")
    if not name.strip():
        raise InvalidJobNameError("job name must not be empty or only whitespace")
    if name != name.strip():
        raise InvalidJobNameError(f"job name {name!r} has leading or trailing whitespace")
    if len(name) > MAX_JOB_NAME_LENGTH:
        raise InvalidJobNameError(
            f"job name {name[:40]!r}... is {len(name)} characters, "
            f"longer than {MAX_JOB_NAME_LENGTH}"
        )
    if _has_control_characters(name):
        raise InvalidJobNameError(f"job name {name!r} contains control characters")
    return name


def check_namespace(namespace: object) -> str:
    """Return ``namespace`` (``""`` for none) if the database can store it and a log line
    can show it, else raise :class:`ConfigurationError` saying why."""
    return _identity(namespace, "namespace", ConfigurationError, may_be_empty=True)


def check_replica_id(replica_id: object) -> str:
    """Return ``replica_id`` if it can name a replica in the ledger and the logs, else raise
    :class:`InvalidJobOptionError` saying why."""
    return _identity(replica_id, "replica_id", InvalidJobOptionError, may_be_empty=False)


def _identity(
    value: object, what: str, error: type[ConfigurationError], *, may_be_empty: bool
) -> str:
    if not isinstance(value, str) or not (may_be_empty or value.strip()):
        kind = "a str" if may_be_empty else "a non-empty string"
        raise error(f"{what} must be {kind}, not {value!r}")
    if _has_control_characters(value):
        raise error(f"{what} {value!r} contains control characters (a NUL byte, a newline...)")
    return value


def _has_control_characters(text: str) -> bool:
    # NUL cannot be stored in a PostgreSQL text column; a newline would forge a log line.
    return any(unicodedata.category(char) in ("Cc", "Cs") for char in text)


class LockKeyRegistry:
    """The lock keys of the jobs registered with one backend: a name is refused, with
    :class:`LockKeyCollisionError`, if another registered name has its key (the two jobs
    would lock each other out). ``key_of`` turns a name into its key (a backend may prefix
    a namespace)."""

    def __init__(self, key_of: Callable[[str], int] = job_lock_key) -> None:
        self.key_of = key_of
        self._names: dict[int, str] = {}  # key -> the name registered on it

    def register(self, name: str) -> int:
        key = self.key_of(name)
        other = self._names.get(key)
        if other is not None and other != name:
            raise LockKeyCollisionError(
                f"job {name!r} has the same lock key ({key}) as job {other!r}: rename one"
            )
        self._names[key] = name
        return key

    def unregister(self, name: str) -> None:
        key = self.key_of(name)
        if self._names.get(key) == name:
            del self._names[key]
