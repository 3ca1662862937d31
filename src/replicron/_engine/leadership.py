"""Leader mode: which of a step's ticks this replica leaves to the leader, and what it takes
up when it becomes the leader itself.

Only the replica holding the backend's leader lease claims the ticks of leader-mode jobs; the
others (standbys) plan them too, and let them go. Claiming stays the unique ledger row, so
two replicas that both count themselves leader for a moment still run each tick once.

A tick that fell due while no replica led (the leader killed, frozen or cut off, until its
lease ran out) has no row. The replica that takes over catches every leader-mode job up, as a
replica starting after downtime does (each job's ``catch_up`` and ``misfire_grace``): from
the job's last recorded tick, or for a job never recorded, from the first tick this replica
left to a leader. So every tick ends with a row, run or missed. A catch-up reaches up to
its instant only: the ticks a standby let go ahead of theirs (planned with the claims' lead
time) and not yet due when it takes over are claimed as they come, not lost between the two.

Pure bookkeeping, no I/O: the engine asks, the backend's :class:`LeaderLease` answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from replicron.backends.base import Backend
from replicron.backends.leadership import LeaderLease

from .capacity import Spreader
from .observe import Observer
from .planner import Decision, Tick
from .registry import JobRegistry

__all__ = ["Leadership"]

_BEFORE = timedelta(microseconds=1)


class Leadership:
    """This replica's part in leader mode; a backend without a lease (one process) always
    leads."""

    def __init__(
        self, backend: Backend, registry: JobRegistry, observer: Observer, wake: Callable[[], None]
    ) -> None:
        self._lease = backend if isinstance(backend, LeaderLease) else None
        self._registry, self._observer = registry, observer
        #: The scheduler's ``leader`` option: a job's own option overrides it.
        self.default = False
        self._wake = wake
        self._contending = False
        self._wanted = False  # a leader-mode job was registered
        self._was_leading = False
        #: Per leader-mode job, the first tick this replica left to a leader since it last
        #: caught the job up: where a catch-up starts for a job the ledger has no row of.
        self._left: dict[str, datetime] = {}
        #: Ticks this replica let go before their instant (claims are planned ahead), kept
        #: until then: a catch-up at takeover reaches up to its own instant, not theirs.
        self._ahead: list[Tick] = []
        #: Where the dispatcher leaves ticks for its threads or other replicas (a shared
        #: backend): the first for leader-mode ticks while this replica leads.
        self.spreader: Spreader | None = None

    def adopt(self, spreader: Spreader | None) -> Spreader | None:
        """Lead through ``spreader``: first for the leader-mode jobs' ticks while leading,
        and none of them kept once no longer leading. Returns it."""
        self.spreader = spreader
        if spreader is not None:
            spreader.first_for = self.first_for
        return spreader

    def led(self, job: str) -> bool:
        """Whether ``job`` is a leader-mode job."""
        state = self._registry.get(job)
        if state is None:
            return False
        leader = state.spec.leader
        return self.default if leader is None else leader

    def by_default(self, leader: bool) -> None:
        """The scheduler's ``leader`` option, before it starts: with it, the replica
        contends from the start."""
        self.default = self._wanted = leader

    def job_changed(self, name: str) -> None:
        """A job was added or updated (any thread): contend from the next step on if it is
        a leader-mode job."""
        if not self._wanted and self.led(name):
            self._wanted = True
            self._wake()

    def first_for(self, job: str) -> bool:
        """Whether this replica claims ``job``'s ticks before any other: it is the leader,
        and ``job`` a leader-mode job."""
        return self._contending and self.led(job) and self.leading()

    def leading(self) -> bool:
        """Whether this replica is the leader now (self-fenced by the backend); never while
        it has no leader-mode job (it does not contend)."""
        lease = self._lease
        return self._contending and (lease is None or lease.leading())

    def _leads_this_step(self) -> bool:
        """Whether this replica claims leader-mode ticks in this step: it led when the step
        began (and so caught the jobs up when it became the leader) and leads still. A
        term won during the step's statements counts from the next step, whose catch-up
        reads where the last leader stopped before any tick of the new term is claimed:
        claimed first, a tick would hide the ones that fell due without a leader."""
        return self._was_leading and self.leading()

    def step(
        self, catch_up: list[str], now: datetime, immediate: list[Tick]
    ) -> tuple[list[str], dict[str, datetime]]:
        """At each step, of the jobs ``catch_up`` asks to catch up: those this replica
        catches up, with where to start for those the ledger has no row of. When it just
        became the leader, every leader-mode job, and the ticks it let go that are not due
        yet join ``immediate``; while it is not, none of them."""
        self._ahead = [tick for tick in self._ahead if tick.scheduled_at > now]
        gained = self._changed()
        catch_up = self.sift_names(catch_up)
        if gained is None:
            return catch_up, {}
        immediate += [tick for tick in self._ahead if self.led(tick.job)]  # not removed
        self._ahead = []
        return list(dict.fromkeys(catch_up + gained[0])), gained[1]

    def _changed(self) -> tuple[list[str], dict[str, datetime]] | None:
        """Contend once a leader-mode job is registered; when this replica just became the
        leader, the leader-mode jobs to catch up and where (``None`` otherwise)."""
        if self._wanted and not self._contending:
            self._contending = True
            if self._lease is not None:
                self._lease.contend(self._wake)
        leading = self._contending and self.leading()
        if leading == self._was_leading:
            return None
        self._was_leading = leading
        observer = self._observer
        if not leading:
            self._drop_deferred()
            observer.log(
                logging.WARNING,
                "leader_lost",
                "this replica is no longer the leader: it "
                "leaves the ticks of leader-mode jobs to the next one",
            )
            observer.notify("on_leader_lost", observer.replica_id)
            return None
        names = [name for name in self._registry.names() if self.led(name)]
        self._registry.chains_retaken(names)  # catch-up leaves fixed-delay jobs to their chain
        # Kept: a job still without a row has had no tick recorded since, and a catch-up
        # that fails is tried again from the same ticks.
        since = {name: at - _BEFORE for name, at in self._left.items()}
        observer.log(
            logging.INFO,
            "leader_gained",
            f"this replica is the leader: it claims the ticks "
            f"of {len(names)} leader-mode jobs, catching up what fell due without a leader",
        )
        observer.notify("on_leader_gained", observer.replica_id)
        return names, since

    def _drop_deferred(self) -> None:
        """No longer the leader: the leader-mode ticks this replica deferred (for a free
        thread) are the next leader's, who catches them up; claimed here, they would be
        claimed by a replica that no longer leads."""
        spreader = self.spreader
        if spreader is None:
            return
        for job in [job for job in spreader.deferred if self.led(job)]:
            self._left.setdefault(job, spreader.deferred.pop(job).scheduled_at)
            self._registry.chain_left(job)

    def sift(self, immediate: list[Tick], decision: Decision) -> list[Tick]:
        """The step's ticks to claim (``immediate`` and those ``decision`` found due), and
        the decision's missed ticks to record, less the leader-mode jobs' unless this replica
        is the leader: a standby neither claims nor records them."""
        decision.missed = self._sifted(decision.missed)
        if decision.older_missed and self._contending and not self._leads_this_step():
            older = decision.older_missed.items()
            decision.older_missed = {job: span for job, span in older if not self.led(job)}
        return self._sifted(immediate + decision.due)

    def _sifted(self, ticks: list[Tick]) -> list[Tick]:
        if not ticks or not self._contending or self._leads_this_step():
            return ticks
        kept: list[Tick] = []
        left = self._left
        for tick in ticks:
            if self.led(tick.job):
                left.setdefault(tick.job, tick.scheduled_at)
                if not self._registry.chain_left(tick.job):  # else retaken by its chain
                    self._ahead.append(tick)
            else:
                kept.append(tick)
        return kept

    def sift_names(self, names: Iterable[str]) -> list[str]:
        """Jobs to catch up less the leader-mode ones, unless this replica is the leader
        (it catches them up as it becomes leader)."""
        if not self._contending or self._leads_this_step():
            return list(names)
        return [name for name in names if not self.led(name)]
