"""A replica joining and leaving the cluster of a shared backend, and which of the ticks it
leaves behind the replicas that stay hold too."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime

from replicron.backends.base import SharedCoordination

from .background import Background
from .health import BackendHealth
from .planner import Tick

__all__ = ["Membership", "held_by_staying"]

#: How long a stopping replica waits, at most, to tell the others it leaves (seconds): two
#: short statements; a server that takes longer must not hold the shutdown up.
LEAVE_WITHIN = 1.0


def held_by_staying(
    ticks: Sequence[Tick], staying: Mapping[str, datetime]
) -> tuple[list[Tick], list[Tick]]:
    """``ticks`` split into those a replica that stays holds too (it was planning at their
    instant, so it deferred them as well) and those nobody that stays knows of."""
    if not staying:
        return [], list(ticks)
    since = min(staying.values())  # a replica plans the ticks strictly after it joined
    held = [tick for tick in ticks if tick.scheduled_at > since]
    return held, [tick for tick in ticks if tick.scheduled_at <= since]


class Membership:
    """Tells a shared backend's other replicas when this one plans from and when it leaves;
    nothing where the backend is not shared."""

    def __init__(
        self, shared: SharedCoordination | None, health: BackendHealth, background: Background
    ) -> None:
        self._shared = shared
        self._health = health
        self._background = background

    async def join(self, since: datetime) -> None:
        """From ``since`` on this replica plans every tick: a replica leaving later hands it
        only ticks from then on."""
        if self._shared is None:
            return
        try:
            await self._shared.join(since)
        except Exception as exc:  # it still plans: only a hand-over is judged less well
            self._health.failed(exc, "telling the others this replica joined", retried=False)
            return
        self._health.answered("telling the others this replica joined")

    async def leave(self, limit: float) -> Mapping[str, datetime] | None:
        """Claiming is over: the other replicas are told at once (they stop leaving this one
        ticks); the replicas that stay, where the backend knows within ``limit`` (at most
        :data:`LEAVE_WITHIN`). Telling them goes on past that: cut off mid-statement, it
        could take the lock session, and with it the locks of the runs going on."""
        if self._shared is None:
            return None
        leaving = asyncio.ensure_future(self._told(self._shared))
        await asyncio.wait({leaving}, timeout=min(limit, LEAVE_WITHIN))
        if leaving.done():
            return leaving.result()
        self._background.spawn(leaving)  # the shutdown waits for it before closing
        return None

    async def _told(self, shared: SharedCoordination) -> Mapping[str, datetime] | None:
        try:
            staying = await shared.leave()
        except Exception as exc:  # unreachable, say: as if nobody knew who stays
            self._health.failed(exc, "telling the others this replica leaves", retried=False)
            return None
        self._health.answered("telling the others this replica leaves")
        return staying
