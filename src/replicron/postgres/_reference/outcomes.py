"""How ticks end: the holder's outcomes (``release``, ``lease_release``), ticks recorded
without a run (``record_unclaimed``) and the rows of claims whose answers were lost
(``close_lost_claims``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .database import Database, Params, interval
from .server import ServerSession
from .tables import OUTCOMES, RunRow, check_outcome

__all__ = [
    "close_lost_claims",
    "lease_release",
    "record_missed_ranges",
    "record_unclaimed",
    "release",
]

#: Outcomes of ticks that never started: a claim that wanted the lock had stamped a start.
_NEVER_STARTED = frozenset({"missed", "skipped_overlap", "skipped_limit"})
_LOST_CLAIM = "claimed, but the claim's answer was lost with the connection; not run"


@dataclass
class _Ended:
    n: int
    run_id: int | None
    job: str
    tick: datetime
    outcome: str
    started: datetime | None
    finished: datetime | None
    error: str | None
    epoch: int | None


def _ended(p: Params, epochs: bool) -> list[_Ended]:
    columns: list[Any] = [
        p["run_ids"],
        p["jobs"],
        p["ticks"],
        p["outcomes"],
        p["started"],
        p["finished"],
        p["errors"],
    ]
    epoch_column: Any = p["epochs"] if epochs else [None] * len(columns[0])
    return [
        _Ended(n, *values)
        for n, values in enumerate(zip(*columns, epoch_column, strict=True), start=1)
    ]


def _targets(db: Database, p: Params, ended: list[_Ended]) -> dict[int, RunRow]:
    """``target``: each record's row, the claimant's own (by run id where given)."""
    namespace, replica = str(p["namespace"]), str(p["replica"])
    found: dict[int, RunRow] = {}
    for e in ended:
        row = db.tables.row_at(namespace, e.job, e.tick)
        if (
            row is not None
            and (e.run_id is None or row.run_id == e.run_id)
            and row.replica_id == replica
        ):
            found[e.n] = row
    return found


def _write(db: Database, row: RunRow, e: _Ended) -> None:
    row.outcome = e.outcome
    row.started_at = None if e.outcome in _NEVER_STARTED else (e.started or row.started_at)
    row.finished_at = e.finished or db.now
    row.error = e.error
    row.heartbeat_at = None


def _record(
    db: Database, ended: list[_Ended], targets: dict[int, RunRow], may: Any
) -> tuple[list[bool], list[str | None]]:
    """``recorded``: the writes the mode allows, all or none (a CHECK violation undoes
    them); answered with ``written`` and ``found``."""
    found = {n: row.outcome for n, row in targets.items()}
    allowed = [e for e in ended if e.n in targets and may(e, targets[e.n], found[e.n])]
    # An UPDATE ... FROM writes a row once, however many records name it.
    once: dict[int, _Ended] = {}
    for e in allowed:
        once.setdefault(targets[e.n].run_id, e)
    for e in once.values():
        check_outcome(e.outcome)
    written = set()
    for e in allowed:
        if once[targets[e.n].run_id] is e:
            _write(db, targets[e.n], e)
        written.add(e.n)
    return [e.n in written for e in ended], [found.get(e.n) for e in ended]


def release(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:release``."""
    ended = _ended(p, epochs=False)
    targets = _targets(db, p, ended)
    written, found = _record(
        db,
        ended,
        targets,
        lambda e, row, was: was is None or was == "abandoned" or was == e.outcome,
    )
    ours = session.is_ours(p["pid"], p["session_token"])
    unlocked = [db.locks.unlock(session, key) if ours else None for key in p["unlock_keys"]]
    return [(written, found, unlocked)]


def lease_release(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``lease.sql:lease_release``."""
    ended = _ended(p, epochs=True)
    targets = _targets(db, p, ended)
    namespace = str(p["namespace"])
    unlock_runs: list[int] = list(p["unlock_runs"])
    written, found = _record(
        db,
        ended,
        targets,
        lambda e, row, was: (
            (e.epoch is None or row.epoch == e.epoch) and (was is None or was == e.outcome)
        ),
    )
    for e, ok in zip(ended, written, strict=True):
        if ok:
            targets[e.n].lease_until = None
    freed = {lock.run_id for lock in db.tables.free_locks(namespace, unlock_runs)}
    return [(written, found, [run_id in freed for run_id in unlock_runs])]


def record_unclaimed(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:record_unclaimed``."""
    namespace, replica, now = str(p["namespace"]), str(p["replica"]), db.now
    columns: list[Any] = [
        p["jobs"],
        p["ticks"],
        p["outcomes"],
        p["errors"],
        p["tokens"],
        p["limits"],
    ]
    request = list(zip(*columns, strict=True))
    tokens = list(p["tokens"])
    limits: dict[str, int] = {}
    for job, _, _, _, _, limit in request:
        if limit is not None:
            limits[job] = min(limits.get(job, limit), limit)
    finished = {
        job: db.last_run(namespace, job, tokens)
        for job, limit in sorted(limits.items())
        if db.runs_reached(namespace, job, limit, tokens)
    }
    recordable_until = now + interval(p["ahead"])
    due = [
        r
        for r in request
        if r[1] <= recordable_until
        and not (r[0] in finished and (finished[r[0]] is None or r[1] > finished[r[0]]))
    ]
    mine = [
        (r, row)
        for r in due
        if (row := db.tables.row_at(namespace, r[0], r[1])) is not None
        and row.claim_token is not None
        and row.claim_token == r[4]
    ]
    mine_outcomes = [row.outcome for _, row in mine]
    in_range = {(r[0], r[1]): db.tables.in_a_range(namespace, r[0], r[1]) for r in due}
    to_insert = sorted((r for r in due if not in_range[(r[0], r[1])]), key=lambda r: (r[0], r[1]))
    closing = [
        (r, row)
        for (r, row), was in zip(mine, mine_outcomes, strict=True)
        if was in (None, "abandoned")
    ]
    _check_before_writing(db, [r[2] for r in to_insert], [r[2] for r, _ in closing])
    inserted = []
    for job, tick, outcome, error, token, _ in to_insert:
        row = RunRow(
            run_id=db.tables.next_run_id(),
            namespace=namespace,
            job=job,
            scheduled_at=tick,
            replica_id=replica,
            claimed_at=now,
            finished_at=now,
            outcome=outcome,
            error=error,
            claim_token=token,
        )
        if db.tables.insert(row):
            inserted.append((job, tick))
    closed = []
    for r, row in closing:
        row.outcome, row.error = r[2], r[3]
        row.finished_at = now
        row.heartbeat_at = row.lease_until = None
        closed.append(row)
    db.tables.free_locks(namespace, (row.run_id for row in closed))
    answer: list[tuple[Any, ...]] = [(job, tick, "recorded") for job, tick in inserted]
    answer += [(row.job, row.scheduled_at, "recorded") for row in closed]
    answer += [
        (r[0], r[1], "recorded")
        for (r, _), was in zip(mine, mine_outcomes, strict=True)
        if was is not None and was != "abandoned"
    ]
    answer += [(r[0], r[1], "early") for r in request if r[1] > recordable_until]
    return answer


def close_lost_claims(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:close_lost_claims``."""
    namespace, now = str(p["namespace"]), db.now
    tokens: list[object] = list(p["tokens"])
    jobs: list[object] = list(p["jobs"])
    closed = [
        row
        for row in db.tables.rows_in(namespace)
        if row.claim_token is not None
        and row.claim_token in tokens
        and row.outcome in (None, "abandoned")
        and row.job in jobs
    ]
    for row in closed:
        row.outcome, row.error, row.finished_at = "missed", _LOST_CLAIM, now
        row.heartbeat_at = row.lease_until = None
    db.tables.free_locks(namespace, (row.run_id for row in closed))
    return [(row.job, row.scheduled_at) for row in closed]


def _check_before_writing(
    db: Database, inserting: list[str | None], updating: list[str | None]
) -> None:
    """The CHECK on ``outcome``, as the statement meets it: the insert first, each row it
    tries drawing its run id before the check (a value the failed statement does not give
    back), then the updates."""
    for tried, outcome in enumerate(inserting, start=1):
        if outcome is not None and outcome not in OUTCOMES:
            db.tables.last_run_id += tried
            check_outcome(outcome)
    for outcome in updating:
        if outcome is not None and outcome not in OUTCOMES:
            db.tables.last_run_id += len(inserting)
            check_outcome(outcome)


def record_missed_ranges(db: Database, session: ServerSession, p: Params) -> list[tuple[Any, ...]]:
    """``queries.sql:record_missed_ranges``."""
    namespace, replica, now = str(p["namespace"]), str(p["replica"]), db.now
    columns = ("jobs", "firsts", "lasts", "counts", "errors")
    request = list(enumerate(zip(*(p[column] for column in columns), strict=True), start=1))
    starts = list(zip(p["starts_of"], p["starts"], strict=True))
    keyed = []
    for place, (job, first, last, count, error) in request:
        rows = db.tables.rows_of(namespace, job)
        if any(
            row.scheduled_through is not None
            and row.scheduled_at <= last
            and row.scheduled_through >= first
            for row in rows
        ):
            continue  # another range lies in its span
        free = [
            tick
            for of, tick in starts
            if of == place and db.tables.row_at(namespace, job, tick) is None
        ]
        held = sum(
            1
            for row in rows
            if first <= row.scheduled_at <= last
            and row.scheduled_through is None
            and not row.manual
        )
        keyed.append((place, job, min(free) if free else None, last, count - held, error))
    inserted = []
    keys = [  # a range every start of whose span has a row has no key: it is not written
        (job, key, last, ticks, error)
        for _, job, key, last, ticks, error in keyed
        if key is not None
    ]
    for job, key, last, ticks, error in sorted(keys, key=lambda k: (k[0], k[1])):
        row = RunRow(
            run_id=db.tables.next_run_id(),
            namespace=namespace,
            job=job,
            scheduled_at=key,
            replica_id=replica,
            claimed_at=now,
            finished_at=now,
            outcome="missed",
            error=error,
            scheduled_through=last,
            ticks=ticks,
        )
        if db.tables.insert(row):
            inserted.append((job, key, ticks))
    return [
        (place, ticks)
        for job, key, ticks in inserted
        for place, of_job, of_key, *_ in keyed
        if (of_job, of_key) == (job, key)
    ]
