"""A backend's cluster registry (pause, resume, cluster_status), and its calls from
synchronous code."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from replicron.backends.base import ClusterRegistry
from replicron.errors import ConfigurationError

__all__ = ["blocking", "registry_of"]

_T = TypeVar("_T")


def registry_of(backend: object, what: str) -> ClusterRegistry:
    """``backend`` as a cluster registry, or a ConfigurationError saying that ``what`` needs
    one."""
    if not isinstance(backend, ClusterRegistry):
        raise ConfigurationError(
            f"{type(backend).__name__} keeps no cluster registry: {what} needs "
            "MemoryBackend, EmbeddedBackend or PostgresBackend"
        )
    return backend


def blocking(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run one of a backend's cluster calls from synchronous code, on any thread, running
    loop or not: the shared backends read and write the registry with a short connection of
    their own, so a private event loop on a thread of its own serves (it blocks the caller
    for one round trip)."""
    with ThreadPoolExecutor(1, thread_name_prefix="replicron-cluster") as pool:
        return pool.submit(asyncio.run, coroutine).result()
