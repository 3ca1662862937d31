"""PostgreSQL coordination (``pip install replicron[postgres]``)."""

from __future__ import annotations

from ._session import BackendUnavailableError, TransactionPoolerError
from .backend import JobStatus, LockKeyCollisionError, PostgresBackend
from .migrate import migrate

__all__ = [
    "BackendUnavailableError",
    "JobStatus",
    "LockKeyCollisionError",
    "PostgresBackend",
    "TransactionPoolerError",
    "migrate",
]
