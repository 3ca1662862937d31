"""What a claim statement answers for each tick it was asked for, and how early it may ask."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from replicron.backends.base import Claim, ClaimRequest, ClaimStatus

__all__ = ["CLAIM_AHEAD", "ClaimRow"]

#: How far ahead of the database's clock a tick may be claimed: room for the error of the
#: measured offset, far less than any tick spacing.
CLAIM_AHEAD = timedelta(milliseconds=250)

_STATUS = {
    "claimed": ClaimStatus.CLAIMED,
    "locked_claimed": ClaimStatus.CLAIMED,
    "taken": ClaimStatus.TAKEN,
    "locked": ClaimStatus.LOCKED,
    "early": ClaimStatus.EARLY,
    "exhausted": ClaimStatus.EXHAUSTED,
    "paused": ClaimStatus.PAUSED,
}


class ClaimRow(NamedTuple):
    """One tick of a claim: its run, what became of it (``status``: one of ``_STATUS``, or
    ``moved`` when the statement ran on another server session than the lock session's)
    and, for a tick refused as ``locked``, the freshest other open run of the job: its
    replica, whether its heartbeat is stale, and the server session holding the lock."""

    job: str
    tick: datetime
    run_id: int | None
    status: str
    blocker: str | None
    stale: bool | None
    holder: int | None

    @property
    def opened(self) -> int | None:
        """The run now open for this replica, if any: a refused tick's row is recorded
        skipped_overlap at once (by tick), a paused tick's is closed already."""
        return None if self.status in ("locked", "paused") else self.run_id

    @property
    def locked_run(self) -> int | None:
        """The run that won the tick and took its job's lock, if any."""
        return self.run_id if self.status == "locked_claimed" else None

    @property
    def frozen_holder(self) -> int | None:
        """For a tick refused the lock by a session whose run stopped heartbeating (its
        replica is frozen, or cut off in a way its server session does not notice): the
        server process of that session."""
        return self.holder if self.status == "locked" and self.stale else None

    def claim(self, request: ClaimRequest) -> Claim:
        """The answer to ``request``, the tick this row is about."""
        status = _STATUS[self.status]
        run_id = None if status is ClaimStatus.LOCKED else self.run_id
        locked = self.status == "locked_claimed"
        return Claim(request.job, request.scheduled_at, status, run_id, locked, request.manual)
