"""Fixed-delay jobs (``after(...)``): the next tick is the last finish in the ledger plus the
delay, the same on every replica that reads the same row. Pure: no clock, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from replicron.backends.base import LastFinish
from replicron.triggers import FixedDelayTrigger, Trigger

__all__ = ["CHAIN_READ_MAX", "CHAIN_READ_MIN", "KEEP", "Chain", "chain_of"]

#: How often the ledger is read for a fixed-delay job whose next tick is not known yet (its
#: run goes on somewhere): a quarter of its delay, within these bounds. The replica that ran
#: it reads at once when its outcome is written; the others learn the finish within this.
CHAIN_READ_MIN, CHAIN_READ_MAX = timedelta(milliseconds=50), timedelta(seconds=1)


class _Keep:
    """What :meth:`Chain.learn` returns when the planned tick stands."""


KEEP = _Keep()


@dataclass(slots=True)
class Chain:
    """A fixed-delay job's link to the ledger."""

    delay: timedelta
    read_every: timedelta
    #: When to read the ledger for the job next (``None``: its next tick is known).
    read_at: datetime | None
    #: The latest tick handed out here: a ledger row older than it is from before that
    #: tick's claim, so it says nothing of what follows.
    handed_out: datetime | None = None
    #: The planned tick was learned from the ledger, or checked there at its instant. The
    #: first tick of a job with no row is the trigger's, read once more when it falls due, so
    #: a replica started just after another claimed it does not start a second chain.
    confirmed: bool = False
    #: The tick handed out was left to the leader (a leader-mode job on a standby), not
    #: claimed here: should this replica lead before the ledger has it, it claims it itself.
    left: bool = False
    #: The job's first tick, while the ledger has no row of it: kept out of the plan until a
    #: read at its very instant (not a claim lead ahead of it) still finds none. Replicas
    #: started on either side of a tick of the grid plan different first ticks; the later
    #: one, read at its instant, finds the earlier one's row and follows its chain.
    holding: bool = False

    def wants_read(self, now: datetime, due: datetime | None) -> bool:
        """Whether to read the job's last finish at ``now`` (``due``: its planned tick); if
        so, the next read is a little later unless :meth:`learn` is told the row first."""
        read_at = self.read_at
        if (read_at is not None and read_at <= now) or (
            not self.confirmed and due is not None and due <= now
        ):
            self.read_at = now + self.read_every
            return True
        return False

    def hand_out(self, tick: datetime) -> None:
        """``tick`` is due and handed out for a claim: the next one follows its end."""
        self.handed_out, self.confirmed, self.left = tick, False, False
        self.read_at = tick + self.read_every

    def retake(self, now: datetime) -> datetime | None:
        """This replica now leads: the tick it left to the leader, to plan again (read the
        ledger first, at ``now``), or ``None`` if it left none."""
        tick = self.handed_out
        if not self.left or tick is None:
            return None
        self.handed_out, self.confirmed, self.left = None, False, False
        self.read_at = now
        return tick

    def learn(
        self,
        last: LastFinish | None,
        now: datetime,
        due: datetime | None,
        start_at: datetime | None,
    ) -> datetime | _Keep | None:
        """The job's next tick by its latest ledger row ``last`` read at ``now`` (``None``
        while its run goes on), or :data:`KEEP`: the planned one ``due`` stands."""
        handed_out = self.handed_out
        if last is None or (handed_out is not None and last.scheduled_at < handed_out):
            if handed_out is not None:  # the tick handed out is not claimed yet: read later
                return KEEP
            # No row yet: the trigger's first tick stands, planned once read at its instant.
            if self.holding and due is not None and due > now:
                self.read_at = due
                return KEEP
            self.read_at = None
            self.confirmed = due is not None and due <= now
            if self.holding:
                self.holding = False
                return due
            return KEEP
        self.holding = False
        if last.outcome is None:  # open: no next tick until it ends
            self.confirmed = False
            return None
        # A row ended without a finish time still ends the link: the chain never stalls.
        ended = last.scheduled_at if last.finished_at is None else last.finished_at
        # After the row's tick, whatever the clocks: the chain never claims a tick twice.
        tick = max(ended, last.scheduled_at) + self.delay
        if start_at is not None and tick < start_at:
            tick = start_at
        self.read_at, self.confirmed = None, True
        return tick


def chain_of(trigger: Trigger, now: datetime) -> Chain | None:
    """The chain of a job with ``trigger`` planned at ``now`` (read the ledger at once), or
    ``None`` for a trigger whose ticks do not follow finishes."""
    if not isinstance(trigger, FixedDelayTrigger):
        return None
    read_every = min(CHAIN_READ_MAX, max(CHAIN_READ_MIN, trigger.delay / 4))
    return Chain(trigger.delay, read_every, now)
