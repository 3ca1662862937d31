"""Reads of the ledger for fixed-delay jobs: one statement for every such job whose next tick
is not known yet, at a modest cadence (see ``chain.Chain``)."""

from __future__ import annotations

import logging
from datetime import datetime

from replicron.backends.base import Backend, LastFinishes

from .observe import Observer
from .registry import JobRegistry

__all__ = ["ChainReads"]


class ChainReads:
    def __init__(self, backend: Backend, registry: JobRegistry, observer: Observer) -> None:
        self._reader = backend if isinstance(backend, LastFinishes) else None
        self._registry, self._observer = registry, observer
        self._failing = False

    async def read(self, now: datetime) -> None:
        """Read the last finish of each fixed-delay job that needs it at ``now`` and plan its
        next tick. A failed read is logged once until one succeeds, and tried again at the
        job's next read (its tick waits: no finish, no tick)."""
        jobs = self._registry.chains_to_read(now)
        if not jobs or self._reader is None:
            return
        try:
            found = await self._reader.last_finishes(jobs)
        except Exception as exc:
            if not self._failing:
                self._observer.log(
                    logging.ERROR, "lock_error", f"could not read the last finish of "
                    f"fixed-delay jobs {', '.join(jobs)}: {exc!r}", exc_info=exc,
                )  # fmt: skip
            self._failing = True
            return
        self._failing = False
        self._registry.chains_learned(jobs, found, now)

    def read_at(self) -> datetime | None:
        return self._registry.chain_read_at()
