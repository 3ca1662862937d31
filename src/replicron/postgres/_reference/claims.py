"""``claim`` (advisory) and ``lease_claim`` (row lease): a batch of ticks in one statement.

Both follow the same steps, as their SQL does: the request, the jobs past ``max_runs``, the
rows present as the statement starts (one of them this claim's own earlier try), the
inserts in (job, tick) order, the earlier tries reopened, the ticks won, and per tick its
status. Reads of ``replicron_runs`` and ``replicron_job_locks`` after the writes see the
statement's snapshot, as in PostgreSQL: they are taken before the first write."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from .database import Database, Params, interval
from .server import ServerSession
from .tables import JobLockRow, RunRow

__all__ = ["claim", "lease_claim", "take_job_lock"]


@dataclass
class _Request:
    n: int
    job: str
    tick: datetime
    want_lock: bool
    token: UUID | None
    manual: bool
    max_runs: int | None
    lock_key: int | None = None


@dataclass
class _Won:
    run_id: int
    job: str
    tick: datetime
    paused: bool
    epoch: int
    want_lock: bool
    nth: int = 0


def _requests(p: Params, keyed: bool) -> list[_Request]:
    columns: list[Any] = [p["jobs"], p["ticks"], p["locks"], p["tokens"], p["manual"], p["limits"]]
    keys: list[Any] = list(p["keys"]) if keyed else [None] * len(columns[0])
    return [
        _Request(n, job, tick, lock, token, manual, limit, key)
        for n, (job, tick, lock, token, manual, limit, key) in enumerate(
            zip(*columns, keys, strict=True), start=1
        )
    ]


class _Claim:
    """What both claims share, up to the ticks won."""

    def __init__(self, db: Database, p: Params, keyed: bool) -> None:
        self.db = db
        self.namespace = str(p["namespace"])
        self.replica = str(p["replica"])
        self.stale_after = interval(p["stale_after"])
        self.now = db.now
        self.requests = _requests(p, keyed)
        tokens = list(p["tokens"])
        self.exhausted = {
            job
            for job, limit in _limits(self.requests)
            if db.runs_reached(self.namespace, job, limit, tokens)
        }
        self.claimable_until = self.now + interval(p["ahead"])
        self.paused = {
            r.job
            for r in self.requests
            if not r.manual and (self.namespace, r.job) in db.tables.paused
        }
        self.present = {r.n: db.tables.row_at(self.namespace, r.job, r.tick) for r in self.requests}
        self.in_range = {
            r.n: db.tables.in_a_range(self.namespace, r.job, r.tick) for r in self.requests
        }

    def is_ours(self, r: _Request, row: RunRow | None) -> bool:
        return (
            row is not None
            and row.claim_token is not None
            and row.claim_token == r.token
            and row.outcome in (None, "abandoned")
        )

    def held_paused(self, r: _Request) -> bool:
        return not r.manual and r.job in self.paused

    def insertable(self, r: _Request) -> bool:
        return (
            self.present[r.n] is None
            and (r.manual or r.tick <= self.claimable_until)
            and (r.max_runs is None or r.manual or r.job not in self.exhausted)
            and not self.in_range[r.n]
        )

    def insert(self, r: _Request, session: ServerSession, leased: bool) -> _Won | None:
        """The ``inserted`` step for one request: a run id drawn, the row in unless the tick's
        key is taken meanwhile (by an earlier insert of this same statement)."""
        paused = self.held_paused(r)
        now = self.now
        row = RunRow(
            run_id=self.db.tables.next_run_id(),
            namespace=self.namespace,
            job=r.job,
            scheduled_at=r.tick,
            replica_id=self.replica,
            claimed_at=now,
            heartbeat_at=None if paused else now,
            started_at=now if r.want_lock and not paused else None,
            claim_token=r.token,
            lock_key=None if leased else r.lock_key,
            backend_pid=None if leased else session.pid,
            manual=r.manual,
            outcome="paused" if paused else None,
            finished_at=now if paused else None,
            error="the job is paused" if paused else None,
            lease_until=None if paused or not leased else now + self.stale_after,
        )
        if not self.db.tables.insert(row):
            return None
        return _Won(row.run_id, r.job, r.tick, paused, row.epoch, False)

    def take(self, session: ServerSession, leased: bool) -> list[_Won]:
        """``inserted`` and ``earlier``: the rows this claim writes, new or reopened."""
        mine = [
            won
            for r in self.ordered()
            if self.insertable(r) and (won := self.insert(r, session, leased)) is not None
        ]
        reopened = {
            row.run_id: row
            for r in self.requests
            if self.is_ours(r, row := self.present[r.n]) and row is not None
        }
        for row in reopened.values():
            row.heartbeat_at = self.now
            if leased:  # a row a janitor wrote off meanwhile opens in a new epoch
                row.lease_until = self.now + self.stale_after
                row.epoch += 1 if row.outcome == "abandoned" else 0
            else:
                row.backend_pid = session.pid
            row.outcome = row.finished_at = row.error = None
            mine.append(_Won(row.run_id, row.job, row.scheduled_at, False, row.epoch, False))
        return mine

    def won(self, mine: list[_Won]) -> list[tuple[_Request, _Won | None]]:
        """``won`` joined back to the request (``decided``'s ``LEFT JOIN won``), with each won
        tick's place among the job's ticks that want the lock."""
        joined: list[tuple[_Request, _Won]] = []
        for won in mine:
            for r in self.requests:
                if (r.job, r.tick) == (won.job, won.tick):
                    joined.append(
                        (
                            r,
                            _Won(
                                won.run_id,
                                won.job,
                                won.tick,
                                won.paused,
                                won.epoch,
                                r.want_lock and not won.paused,
                            ),
                        )
                    )
        counts: dict[tuple[str, bool], int] = {}
        for r, won in sorted(joined, key=lambda pair: pair[1].tick):
            part = (won.job, r.want_lock and not won.paused)
            counts[part] = counts.get(part, 0) + 1
            won.nth = counts[part]
        decided: list[tuple[_Request, _Won | None]] = []
        for r in self.requests:
            matches = [won for (req, won) in joined if (req.job, req.tick) == (r.job, r.tick)]
            if not matches:
                decided.append((r, None))
            decided.extend((r, won) for won in matches)
        return decided

    def settled(self, r: _Request, won: _Won | None) -> str | None:
        """A tick's status where the job's lock has no say in it, else None."""
        if won is None:
            return self.unwon_status(r)
        if won.paused:
            return "paused"
        if not won.want_lock:
            return "claimed"
        return None

    def unwon_status(self, r: _Request) -> str:
        if not r.manual and r.tick > self.claimable_until:
            return "early"
        if r.max_runs is not None and not r.manual and r.job in self.exhausted:
            return "exhausted"
        return "taken"

    def ordered(self) -> list[_Request]:
        return sorted(self.requests, key=lambda r: (r.job, r.tick))


def _limits(requests: list[_Request]) -> list[tuple[str, int]]:
    limits: dict[str, int] = {}
    for r in requests:
        if r.max_runs is not None and not r.manual:
            limits[r.job] = min(limits.get(r.job, r.max_runs), r.max_runs)
    return sorted(limits.items())


def claim(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:claim``."""
    c = _Claim(db, p, keyed=True)
    ours = session.is_ours(p["pid"], p["session_token"])
    fresh_after = c.now - c.stale_after
    # What the statement's snapshot holds of each job's open started rows (the overlap check
    # and the blocker read them after the inserts, which they do not see).
    open_started = {
        r.job: [
            (row.run_id, row.replica_id, row.heartbeat_at)
            for row in db.tables.rows_of(c.namespace, r.job)
            if row.outcome is None and row.started_at is not None
        ]
        for r in c.requests
    }
    mine = c.take(session, leased=False) if ours else []
    # The outer query decides the ticks in request order, reading each one's blocker and
    # its lock's holder as it goes; the server's locks it reads once (a function scan is read
    # once and rescanned), at the first refused tick: a lock a later tick takes is not seen.
    answers: list[tuple[Any, ...]] = []
    holders: dict[int, int] | None = None
    for r, won in c.won(mine):
        status = c.settled(r, won) if ours else "moved"
        if status is None:
            assert won is not None  # settled() answers every tick not won
            assert r.lock_key is not None  # the backend sends a key with every tick
            alone = won.nth == 1 and _lock_if_alone(
                db, session, r.lock_key, won.run_id, open_started[won.job], fresh_after
            )
            status = "locked_claimed" if alone else "locked"
        run_id = None if won is None else won.run_id
        blocker: tuple[Any, Any] = (None, None)
        pid = None
        if status == "locked":
            others = [o for o in open_started[r.job] if o[0] != run_id]
            if others:
                _, replica, beat = max(
                    others, key=lambda o: (o[2] is not None, o[2] or datetime.min)
                )
                blocker = (replica, None if beat is None else beat <= fresh_after)
            if holders is None:
                holders = db.locks.holders()
            pid = None if r.lock_key is None else holders.get(r.lock_key)
        answers.append((r.job, r.tick, run_id, status, *blocker, pid))
    return answers


def _lock_if_alone(
    db: Database,
    session: ServerSession,
    key: int,
    run_id: int,
    open_started: list[tuple[int, str, datetime | None]],
    fresh_after: datetime,
) -> bool:
    """``pg_try_advisory_lock``, then the overlap check: the lock is given back if another
    started run of the job is still heartbeating."""
    if not db.locks.try_lock(session, key):
        return False
    if any(
        other != run_id and beat is not None and beat > fresh_after
        for other, _, beat in open_started
    ):
        db.locks.unlock(session, key)
        return False
    return True


def lease_claim(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``lease.sql:lease_claim``."""
    c = _Claim(db, p, keyed=False)
    holders = {
        r.job: (
            lock.replica_id if (lock := db.tables.job_locks.get((c.namespace, r.job))) else None
        )
        for r in c.requests
    }
    mine = c.take(session, leased=True)
    decided = c.won(mine)
    locked: set[int] = set()
    firsts = sorted(
        (won for _, won in decided if won is not None and won.want_lock and won.nth == 1),
        key=lambda won: won.job,
    )
    taken_for: set[tuple[str, int]] = set()
    for first in firsts:
        if (first.job, first.run_id) in taken_for:
            continue  # one row of won per request joined: the insert sees the run once
        taken_for.add((first.job, first.run_id))
        if take_job_lock(db, c.namespace, first.job, first.run_id, c.replica, c.stale_after):
            locked.add(first.run_id)
    answers: list[tuple[Any, ...]] = []
    for r, won in decided:
        status = c.settled(r, won)
        if status is None:
            status = "locked_claimed" if won is not None and won.run_id in locked else "locked"
        answers.append(
            (
                r.job,
                r.tick,
                None if won is None else won.run_id,
                status,
                holders[r.job] if status == "locked" else None,
                None if won is None else won.epoch,
            )
        )
    return answers


def take_job_lock(
    db: Database, namespace: str, job: str, run_id: int, replica: str, stale_after: timedelta
) -> bool:
    """The compare-and-set on a job's lock row (``INSERT INTO replicron_job_locks ... ON
    CONFLICT DO UPDATE ... WHERE`` free, the same run's, or run out)."""
    now = db.now
    lock = db.tables.job_locks.get((namespace, job))
    if lock is None:
        until = now + stale_after
        db.tables.job_locks[(namespace, job)] = JobLockRow(
            namespace, job, run_id, replica, 1, until
        )
        return True
    if (
        lock.run_id is None
        or lock.run_id == run_id
        or (lock.lease_until is not None and lock.lease_until <= now)
    ):
        lock.run_id, lock.replica_id = run_id, replica
        lock.epoch += 1
        lock.lease_until = now + stale_after
        return True
    return False
