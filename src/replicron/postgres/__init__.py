"""PostgreSQL coordination (``pip install replicron[postgres]``)."""

from __future__ import annotations

from ._housekeeping import MixedModesError
from ._locked_async import LockedRun, alocked_run
from ._locked_sync import locked_run
from ._probe import UntrustedAdvisoryLocksError
from ._session import BackendUnavailableError, TransactionPoolerError
from ._setting_names import SettingNames
from ._sources import ConnectionSource, conninfo_of
from .backend import (
    CoordinationMode,
    JobStatus,
    LockKeyCollisionError,
    PostgresBackend,
    ReplicaStatus,
)
from .migrate import migrate

__all__ = [
    "BackendUnavailableError",
    "ConnectionSource",
    "CoordinationMode",
    "JobStatus",
    "LockKeyCollisionError",
    "LockedRun",
    "MixedModesError",
    "PostgresBackend",
    "ReplicaStatus",
    "SettingNames",
    "TransactionPoolerError",
    "UntrustedAdvisoryLocksError",
    "alocked_run",
    "conninfo_of",
    "locked_run",
    "migrate",
]
