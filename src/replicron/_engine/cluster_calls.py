"""Calls of a backend's cluster methods (pause, resume, cluster_status) from synchronous
code."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from replicron.errors import ConfigurationError

__all__ = ["call_backend", "cluster_method"]

_T = TypeVar("_T")


def call_backend(backend: object, method: str, *args: Any) -> Any:
    """Call one of the cluster methods of ``backend`` (pause, resume, cluster_status) from
    synchronous code, on any thread, running loop or not: the shared backends read and
    write these with a short connection of their own, so a private event loop on a thread of
    its own serves (it blocks the caller for one round trip)."""
    return _blocking(cluster_method(backend, method)(*args))


def cluster_method(backend: object, method: str) -> Any:
    """``backend``'s cluster method of that name, or a ConfigurationError saying that the
    backend keeps no cluster registry."""
    bound = getattr(backend, method, None)
    if bound is None:
        raise ConfigurationError(
            f"{type(backend).__name__} keeps no cluster registry: {method} needs "
            "MemoryBackend, EmbeddedBackend or PostgresBackend"
        )
    return bound


def _blocking(coroutine: Coroutine[Any, Any, _T]) -> _T:
    with ThreadPoolExecutor(1, thread_name_prefix="replicron-cluster") as pool:
        return pool.submit(asyncio.run, coroutine).result()
