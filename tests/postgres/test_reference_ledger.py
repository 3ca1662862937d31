"""The reference ledger answers every statement as the SQL does.

Random sequences of the protocol's statements, each with the parameters the backend sends
(claims of new ticks and retried ones, queued locks, outcomes of runs that are this
replica's and of runs that are not, heartbeats, janitors, pauses, the leader lease, lost
sessions), run on the model and on PostgreSQL at one controlled clock; every answer and,
after each statement, every table must be the same. A failing seed prints its statements.
``REPLICRON_REFERENCE_SEEDS`` runs more seeds than CI does.
"""

from __future__ import annotations

import contextlib
import os
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from replicron.keys import job_lock_key
from replicron.postgres._claims import CLAIM_AHEAD
from replicron.postgres._reference.tables import OUTCOMES
from tests.helpers import fresh_database
from tests.postgres.reference_pair import Pair, Replica, rows_apart

Mode = Literal["advisory", "lease"]

SEEDS = int(os.environ.get("REPLICRON_REFERENCE_SEEDS", "20"))
STEPS = 100
JOBS = ("alpha", "beta", "gamma")
LIMITED = {"gamma": 2}
NAMESPACE = "default"
GRID = timedelta(seconds=5)
STALE_AFTER = timedelta(seconds=15)
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class Known:
    """A run as a replica learnt it from a claim's answer."""

    run_id: int
    job: str
    tick: datetime
    replica: int
    status: str
    epoch: int


class Sequence:
    """One seed's statements, each made from what the earlier answers said."""

    def __init__(self, seed: int, mode: Mode, pair: Pair) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.mode = mode
        self.pair = pair
        self.runs: list[Known] = []
        self.tokens: dict[tuple[int, str, datetime], uuid.UUID] = {}
        self.trace: list[str] = []

    # ---- the steps --------------------------------------------------------------------

    def steps(self) -> list[tuple[float, Callable[[int], tuple[str, dict[str, Any]]]]]:
        claims = self.claim if self.mode == "advisory" else self.lease_claim
        return [
            (6, claims),
            (2, self.lock),
            (4, self.release),
            (3, self.heartbeat),
            (1.5, self.janitor),
            (1.5, self.record_unclaimed),
            (0.7, self.record_missed_ranges),
            (0.5, self.close_lost_claims),
            (1, self.reads),
            (1, self.pause_or_resume),
            (1, self.leadership),
            (1, self.membership),
            (2, self.registry),
            (0.5, self.retention),
        ]

    def next(self) -> tuple[str, int, dict[str, Any]]:
        weights, makers = zip(*self.steps(), strict=True)
        maker = self.rng.choices(makers, weights)[0]
        replica = self.rng.randrange(len(self.pair.replicas))
        name, params = maker(replica)
        return name, replica, {"namespace": NAMESPACE, **params}

    def session(self, replica: int) -> dict[str, Any]:
        """What the lock session adds to every statement: its pid and token; now and then
        another session's, as a statement a pooler moved would carry."""
        sent_for = self.pair.replicas[replica]
        if self.rng.random() < 0.05:
            sent_for = self.rng.choice(self.pair.replicas)
        return {"pid": sent_for.pid, "session_token": sent_for.token}

    def ticks(self) -> list[datetime]:
        base = START + GRID * ((self.pair.now - START) // GRID)
        return [base + GRID * k for k in range(-6, 2)]

    def batch(self, replica: int) -> list[dict[str, Any]]:
        wanted = []
        for job in self.rng.sample(JOBS, self.rng.randint(1, 3)):
            for tick in self.rng.sample(self.ticks(), self.rng.randint(1, 2)):
                manual = self.rng.random() < 0.1
                if manual:
                    tick = self.pair.now - timedelta(milliseconds=self.rng.randint(0, 900))
                key = (replica, job, tick)
                if key not in self.tokens or self.rng.random() < 0.7:
                    self.tokens[key] = uuid.uuid4()  # a new claim; else a retried one
                wanted.append(
                    {
                        "job": job,
                        "tick": tick,
                        "lock": self.rng.random() < 0.6,
                        "manual": manual,
                        "limit": LIMITED.get(job),
                        "token": self.tokens[key],
                    }
                )
        return wanted

    def claim(self, replica: int) -> tuple[str, dict[str, Any]]:
        wanted = self.batch(replica)
        return "claim", {
            "jobs": [w["job"] for w in wanted],
            "ticks": [w["tick"] for w in wanted],
            "keys": [job_lock_key(w["job"]) for w in wanted],
            "locks": [w["lock"] for w in wanted],
            "manual": [w["manual"] for w in wanted],
            "limits": [w["limit"] for w in wanted],
            "tokens": [w["token"] for w in wanted],
            "replica": f"r{replica}",
            "ahead": CLAIM_AHEAD,
            "stale_after": STALE_AFTER,
            **self.session(replica),
        }

    def lease_claim(self, replica: int) -> tuple[str, dict[str, Any]]:
        _, params = self.claim(replica)
        for name in ("keys", "pid", "session_token"):
            del params[name]
        return "lease_claim", params

    def some_runs(self, replica: int, most: int) -> list[Known]:
        own = [run for run in self.runs if run.replica == replica]
        pool = own if own and self.rng.random() < 0.9 else self.runs
        return self.rng.sample(pool, min(len(pool), self.rng.randint(1, most)))

    def lock(self, replica: int) -> tuple[str, dict[str, Any]]:
        [run] = self.some_runs(replica, 1) or [Known(10**6, "alpha", START, replica, "", 0)]
        if self.mode == "advisory":
            return "lock", {
                "key": job_lock_key(run.job),
                "job": run.job,
                "run_id": run.run_id,
                "stale_after": STALE_AFTER,
                **self.session(replica),
            }
        epoch = run.epoch if self.rng.random() < 0.9 else run.epoch + 1
        return "lease_lock", {
            "job": run.job,
            "run_id": run.run_id,
            "epoch": epoch,
            "replica": f"r{replica}",
            "stale_after": STALE_AFTER,
        }

    def release(self, replica: int) -> tuple[str, dict[str, Any]]:
        ended = self.some_runs(replica, 3)
        outcomes = sorted(OUTCOMES - {"paused"})
        chosen = ["bogus" if self.rng.random() < 0.02 else self.rng.choice(outcomes) for _ in ended]
        unlocking = [run for run in ended if run.status == "locked_claimed"]
        params = {
            "run_ids": [None if self.rng.random() < 0.1 else run.run_id for run in ended],
            "jobs": [run.job for run in ended],
            "ticks": [run.tick for run in ended],
            "outcomes": chosen,
            "started": [self.maybe_earlier() for _ in ended],
            "finished": [self.maybe_earlier() for _ in ended],
            "errors": [self.rng.choice([None, "boom"]) for _ in ended],
            "epochs": [run.epoch - (self.rng.random() < 0.1) for run in ended],
            "replica": f"r{replica}",
            "unlock_keys": [job_lock_key(run.job) for run in unlocking],
            "unlock_runs": [run.run_id for run in unlocking],
        }
        if self.mode == "advisory":
            return "release", {**params, **self.session(replica)}
        return "lease_release", params

    def maybe_earlier(self) -> datetime | None:
        if self.rng.random() < 0.5:
            return None
        return self.pair.now - timedelta(milliseconds=self.rng.randint(0, 3000))

    def heartbeat(self, replica: int) -> tuple[str, dict[str, Any]]:
        runs = self.some_runs(replica, 4)
        params = {
            "run_ids": [run.run_id for run in runs],
            "replica": f"r{replica}",
            "offset_ms": self.rng.choice([None, round(self.rng.uniform(-50, 50), 3)]),
            "stale_after": STALE_AFTER,
            "leaving": self.rng.random() < 0.1,
            "contending": self.rng.random() < 0.5,
            "leader_lease": timedelta(seconds=10),
        }
        if self.mode == "advisory":
            return "heartbeat", {**params, **self.session(replica)}
        epochs = [run.epoch - (self.rng.random() < 0.1) for run in runs]
        locked = [run.run_id for run in runs if run.status == "locked_claimed"]
        return "lease_heartbeat", {**params, "epochs": epochs, "locked_runs": locked}

    def janitor(self, replica: int) -> tuple[str, dict[str, Any]]:
        name = "abandon_stale" if self.mode == "advisory" else "lease_abandon_stale"
        return name, {"stale_after": STALE_AFTER}

    def record_unclaimed(self, replica: int) -> tuple[str, dict[str, Any]]:
        wanted = self.batch(replica)
        return "record_unclaimed", {
            "jobs": [w["job"] for w in wanted],
            "ticks": [w["tick"] for w in wanted],
            "outcomes": [
                "bogus" if self.rng.random() < 0.02 else self.rng.choice(["missed", "paused"])
                for _ in wanted
            ],
            "errors": [self.rng.choice([None, "nobody ran it"]) for _ in wanted],
            "tokens": [w["token"] for w in wanted],
            "limits": [None if w["manual"] else w["limit"] for w in wanted],
            "replica": f"r{replica}",
            "ahead": CLAIM_AHEAD,
        }

    def record_missed_ranges(self, replica: int) -> tuple[str, dict[str, Any]]:
        ranges = []
        for job in self.rng.sample(JOBS, self.rng.randint(1, 2)):
            first = self.ticks()[0] - GRID * self.rng.randint(0, 12)
            span = self.rng.randint(1, 8)
            ranges.append((job, first, first + GRID * span, span + 1))
        starts = [
            (place, first + GRID * k)
            for place, (_, first, _, span) in enumerate(ranges, start=1)
            for k in range(min(span, 3))
        ]
        return "record_missed_ranges", {
            "jobs": [job for job, *_ in ranges],
            "firsts": [first for _, first, _, _ in ranges],
            "lasts": [last for _, _, last, _ in ranges],
            "counts": [count for *_, count in ranges],
            "errors": [self.rng.choice([None, "behind"]) for _ in ranges],
            "starts_of": [place for place, _ in starts],
            "starts": [tick for _, tick in starts],
            "replica": f"r{replica}",
        }

    def close_lost_claims(self, replica: int) -> tuple[str, dict[str, Any]]:
        mine = [(job, token) for (r, job, _), token in self.tokens.items() if r == replica]
        chosen = self.rng.sample(mine, min(len(mine), 3))
        return "close_lost_claims", {
            "tokens": [token for _, token in chosen],
            "jobs": sorted({job for job, _ in chosen}),
        }

    def reads(self, replica: int) -> tuple[str, dict[str, Any]]:
        name = self.rng.choice(["last_ticks", "last_finishes", "database_clock", "clock_sample"])
        return name, {"jobs": self.rng.sample(JOBS, self.rng.randint(1, 3))}

    def pause_or_resume(self, replica: int) -> tuple[str, dict[str, Any]]:
        job = self.rng.choice(JOBS)
        if self.rng.random() < 0.5:
            return "pause", {"job": job, "by": f"r{replica}"}
        return "resume", {"job": job}

    def leadership(self, replica: int) -> tuple[str, dict[str, Any]]:
        name = self.rng.choice(["leader_lease", "leader_now", "leader_resign"])
        return name, {"replica": f"r{replica}", "leader_lease": timedelta(seconds=10)}

    def membership(self, replica: int) -> tuple[str, dict[str, Any]]:
        name = self.rng.choice(
            [
                "other_modes",
                "replica_joined",
                "replica_stopped",
                "replicas_staying",
                "server_identity",
            ]
        )
        params: dict[str, Any] = {"replica": f"r{replica}", "stale_after": STALE_AFTER}
        if name == "other_modes":
            params["coordination"] = self.rng.choice(["advisory", "lease"])
        if name == "replica_joined":
            params["since"] = self.pair.now - timedelta(milliseconds=self.rng.randint(0, 5000))
        return name, params

    def registry(self, replica: int) -> tuple[str, dict[str, Any]]:
        keep = timedelta(minutes=10)
        choice = self.rng.random()
        if choice < 0.4:
            return "run_requests", {"jobs": self.rng.sample(JOBS, 2), "keep": keep}
        if choice < 0.7:
            job = self.rng.choice(JOBS)
            return "request_run", {"job": job, "by": f"r{replica}", "keep": keep}
        jobs = self.rng.sample(JOBS, self.rng.randint(0, 3))
        fingerprints = [self.rng.choice(["f1", "f2"]) for _ in jobs]
        latest = self.latest_registrations(f"r{replica}")
        if latest and self.rng.random() < 0.5:  # the jobs of the replica seen last, redefined
            jobs = [job for job, _ in latest]
            fingerprints = [{"f1": "f2", "f2": "f1"}[fingerprint] for _, fingerprint in latest]
        return "announce", {
            "replica": f"r{replica}",
            "stale_after": STALE_AFTER,
            "complete": self.rng.random() < 0.5,
            "jobs": jobs,
            "triggers": [f"every(5 s) of {job}" for job in jobs],
            "fingerprints": fingerprints,
            "graces": [timedelta(seconds=self.rng.choice([1, 30])) for _ in jobs],
            "expected": [
                "{" + ",".join(t.isoformat() for t in self.ticks()[-2:]) + "}" for _ in jobs
            ],
            "removed": self.rng.sample(JOBS, self.rng.randint(0, 1)),
        }

    def latest_registrations(self, besides: str) -> list[tuple[str, str]]:
        """The jobs and fingerprints of the replica other than ``besides`` seen last."""
        tables = self.pair.ledger.db.tables
        seen = sorted(
            (r for r in tables.replicas.values() if r.replica_id != besides),
            key=lambda r: r.last_seen,
        )
        if not seen:
            return []
        last = seen[-1].replica_id
        return sorted(
            (r.job, r.fingerprint) for r in tables.registrations.values() if r.replica_id == last
        )

    def retention(self, replica: int) -> tuple[str, dict[str, Any]]:
        retention = timedelta(seconds=self.rng.choice([20, 60, 600]))
        if self.rng.random() < 0.3:
            return "prune_registry", {"retention": retention}
        return "prune", {
            "retention": retention,
            "requests_keep": timedelta(seconds=self.rng.choice([30, 600])),
            "batch": 1000,
        }

    # ---- what the answers teach ----------------------------------------------------------

    def learn(self, name: str, replica: int, answer: Any) -> None:
        if name not in ("claim", "lease_claim") or answer[0] == "error":
            return
        for row in answer:
            job, tick, run_id, status = row[:4]
            if run_id is None:
                continue
            epoch = row[5] if name == "lease_claim" and row[5] is not None else 0
            self.runs = [run for run in self.runs if run.run_id != run_id]
            self.runs.append(Known(run_id, job, tick, replica, status, epoch))

    def boundaries(self) -> Iterator[datetime]:
        tables = self.pair.ledger.db.tables
        for row in tables.runs.values():
            if row.lease_until is not None:
                yield row.lease_until
            yield (row.heartbeat_at or row.claimed_at) + STALE_AFTER
        for lock in tables.job_locks.values():
            if lock.lease_until is not None:
                yield lock.lease_until
        for lease in tables.leaders.values():
            yield lease.expires_at
        for replica in tables.replicas.values():
            yield replica.last_seen + STALE_AFTER
        for tick in self.ticks():
            yield tick - CLAIM_AHEAD

    def advance(self) -> None:
        """Every statement at an instant of its own, a few ms to a lease's length apart, or
        at exactly an instant where a comparison of the SQL turns (a lease's or a heartbeat's
        end, a leader term's, a tick's claim-ahead margin)."""
        boundaries = [b for b in self.boundaries() if b > self.pair.now]
        if boundaries and self.rng.random() < 0.2:
            self.pair.at(self.rng.choice(boundaries))
            return
        if self.rng.random() < 0.8:
            step = timedelta(milliseconds=self.rng.randint(1, 2500))
        else:
            step = timedelta(seconds=self.rng.randint(3, 20))
        self.pair.at(self.pair.now + step)


@contextlib.contextmanager
def _pair() -> Iterator[Pair]:
    with fresh_database() as conninfo:
        pair = Pair(conninfo, START, replicas=3)
        try:
            yield pair
        finally:
            pair.close()


def _run(seed: int, mode: Mode, pair: Pair, met: set[str]) -> None:
    sequence = Sequence(seed, mode, pair)
    for step in range(STEPS):
        sequence.advance()
        if mode == "advisory" and sequence.rng.random() < 0.03:
            replica: Replica = sequence.rng.choice(pair.replicas)
            replica.reconnect()
            sequence.trace.append(f"{step}: session of pid {replica.pid} lost; a new one")
            continue
        name, index, params = sequence.next()
        lapsed = _lapsed_leases(pair, name, params)
        database = _step_alone(sequence, pair, step, (name, index, params))
        met.update(_what_it_met(name, database))
        if lapsed and database[0] != "error" and not lapsed & set(database[0][1]):
            met.add("lease_heartbeat: a lease that ran out stays out")
        apart = list(rows_apart(*pair.tables()))
        if apart:
            pytest.fail(_report(seed, mode, sequence, "\n".join(apart)))


def _lapsed_leases(pair: Pair, name: str, params: dict[str, Any]) -> set[int]:
    """The open rows a heartbeat is about to renew whose lease ran out already (its holder
    slept past it), as the model holds them before the statement."""
    if name != "lease_heartbeat":
        return set()
    rows = pair.ledger.db.tables.runs
    return {
        run_id
        for run_id, epoch in zip(params["run_ids"], params["epochs"], strict=True)
        if (row := rows.get(run_id)) is not None
        and row.outcome is None
        and row.epoch == epoch
        and row.replica_id == params["replica"]
        and row.lease_until is not None
        and row.lease_until < pair.now
    }


def _what_it_met(name: str, answer: Any) -> Iterator[str]:
    """The answers worth having met at least once: each claim status, an error, an outcome
    written over a janitor's, a lock freed at release."""
    if answer and answer[0] == "error":
        yield f"{name}: error {answer[1]}"
        return
    if name in ("claim", "lease_claim"):
        yield from (f"{name}: {row[3]}" for row in answer)
    if name in ("release", "lease_release"):
        [(written, found, unlocked)] = answer
        if any(ok and was == "abandoned" for ok, was in zip(written, found, strict=True)):
            yield f"{name}: written over abandoned"
        if any(unlocked):
            yield f"{name}: unlocked"
    if name == "prune" and answer[0][0] > 0:
        yield f"{name}: deleted"
    if name == "announce" and answer:
        yield f"{name}: drift"
    if name == "run_requests" and answer:
        yield f"{name}: pending"
    if name == "other_modes" and answer:
        yield f"{name}: found"
    if name == "record_missed_ranges" and answer:
        yield f"{name}: recorded"
    if name in ("abandon_stale", "lease_abandon_stale") and answer:
        yield f"{name}: abandoned"


#: What CI's seeds must meet, per mode: a generator that stops making them tests less.
_CLAIMED = ("claimed", "locked_claimed", "locked", "taken", "early", "exhausted", "paused")
MUST_MEET = {
    "advisory": {
        *(f"claim: {status}" for status in (*_CLAIMED, "moved")),
        "release: written over abandoned",
        "release: unlocked",
        "release: error 23514",
        "record_unclaimed: error 23514",
        "abandon_stale: abandoned",
        "record_missed_ranges: recorded",
        "prune: deleted",
        "announce: drift",
        "run_requests: pending",
        "other_modes: found",
    },
    "lease": {
        *(f"lease_claim: {status}" for status in _CLAIMED),
        "lease_release: unlocked",
        "lease_release: error 23514",
        "lease_abandon_stale: abandoned",
        "lease_heartbeat: a lease that ran out stays out",
    },
}


def _report(seed: int, mode: Mode, sequence: Sequence, what: str) -> str:
    trace = "\n".join(sequence.trace[-40:])
    return f"seed {seed} ({mode}): the model and the SQL differ\n{trace}\n{what}"


@pytest.mark.parametrize("mode", ["advisory", "lease"])
def test_the_reference_ledger_answers_every_statement_as_the_sql_does(mode: Mode) -> None:
    met: set[str] = set()
    with _pair() as pair:
        for seed in range(SEEDS):
            pair.reset(START)
            _run(seed, mode, pair, met)
    assert sorted(MUST_MEET[mode] - met) == []


#: Of the steps of ``test_two_statements_at_once_end_as_one_after_the_other_would``, how many
#: send two statements at once.
PAIRED = 0.5
#: The statements that draw run ids from the sequence. Two of them at once interleave their
#: ids, which no order of the model gives (the ids are opaque): a pair holds one at most.
#: Two claims of one tick at once are the real-process suite's (tests/postgres/test_*races*).
DRAWS_RUN_IDS = {"claim", "lease_claim", "record_unclaimed", "record_missed_ranges"}


def _run_paired(seed: int, mode: Mode, pair: Pair, orders: Counter[str]) -> None:
    sequence = Sequence(seed, mode, pair)
    for step in range(STEPS):
        sequence.advance()
        name, index, params = sequence.next()
        if sequence.rng.random() < PAIRED:
            other, second, second_params = sequence.next()
            if second != index and not {name, other} <= DRAWS_RUN_IDS:
                both = (name, index, params), (other, second, second_params)
                _step_paired(sequence, pair, *both, orders)
                continue
        _step_alone(sequence, pair, step, (name, index, params))


def _step_alone(
    sequence: Sequence, pair: Pair, step: int, statement: tuple[str, int, dict[str, Any]]
) -> Any:
    """One statement on both sides, which must answer alike: the database's answer."""
    name, index, params = statement
    database, model = pair.run(name, pair.replicas[index], params)
    sequence.trace.append(f"{step} @ {pair.now.isoformat()}: r{index} {name} {params}")
    sequence.trace.append(f"    -> {database}")
    if database != model:
        what = f"the model answered {model}"
        pytest.fail(_report(sequence.seed, sequence.mode, sequence, what))
    sequence.learn(name, index, database)
    return database


def _step_paired(
    sequence: Sequence,
    pair: Pair,
    first: tuple[str, int, dict[str, Any]],
    second: tuple[str, int, dict[str, Any]],
    orders: Counter[str],
) -> None:
    def agree(database: Any, model: Any) -> bool:
        return bool(database == model and not list(rows_apart(*pair.tables())))

    (name_a, a, params_a), (name_b, b, params_b) = first, second
    database, _, order = pair.run_together(
        (name_a, pair.replicas[a], params_a), (name_b, pair.replicas[b], params_b), agree
    )
    sequence.trace.append(f"@ {pair.now.isoformat()}: at once, r{a} {name_a} {params_a}")
    sequence.trace.append(f"    and r{b} {name_b} {params_b}")
    sequence.trace.append(f"    -> {database}")
    if order is None:
        what = "no order of the two on the model ends as the database did"
        pytest.fail(_report(sequence.seed, sequence.mode, sequence, what))
    orders[order] += 1
    sequence.learn(name_a, a, database[0])
    sequence.learn(name_b, b, database[1])


@pytest.mark.parametrize("mode", ["advisory", "lease"])
def test_two_statements_at_once_end_as_one_after_the_other_would(mode: Mode) -> None:
    """The model runs each statement alone; the database runs two at once, the first's
    transaction held open until the second waits on it. Each pair must end, answers and
    tables, as the model running them one after the other (in either order) does."""
    orders: Counter[str] = Counter()
    with _pair() as pair:
        for seed in range(SEEDS // 2):
            pair.reset(START)
            _run_paired(1000 + seed, mode, pair, orders)
        # Pairs that overlapped for real: the second statement waited on the first's lock.
        assert pair.waited > 0, orders
