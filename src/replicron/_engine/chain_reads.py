"""Reads of the ledger for fixed-delay jobs: one statement for every such job whose next tick
is not known yet, at a modest cadence (see ``chain.Chain``)."""

from __future__ import annotations

from datetime import datetime

from replicron.backends.base import Backend, LastFinishes

from .health import BackendHealth
from .registry import JobRegistry

__all__ = ["ChainReads"]

_READING = "reading the last finish of fixed-delay jobs"


class ChainReads:
    def __init__(self, backend: Backend, registry: JobRegistry, health: BackendHealth) -> None:
        self._reader = backend if isinstance(backend, LastFinishes) else None
        self._registry, self._health = registry, health

    async def read(self, now: datetime) -> None:
        """Read the last finish of each fixed-delay job that needs it at ``now`` and plan its
        next tick. A failed read is told to the health, and tried again at the job's next
        read (its tick waits: no finish, no tick)."""
        jobs = self._registry.chains_to_read(now)
        if not jobs or self._reader is None:
            return
        try:
            found = await self._reader.last_finishes(jobs)
        except Exception as exc:
            self._health.failed(exc, _READING)
            return
        self._health.answered(_READING)
        self._registry.chains_learned(jobs, found, now)

    def read_at(self) -> datetime | None:
        return self._registry.chain_read_at()
