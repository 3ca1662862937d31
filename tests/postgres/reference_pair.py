"""The reference ledger and a real PostgreSQL database side by side, on one clock.

Each statement runs on both, by name, with the same parameters, in the same server session
(a connection here, a :class:`ServerSession` there, with the same pid and session token);
both answers come back normalised so that they compare equal exactly when the SQL and the
model agree. The database's ``now()`` and ``clock_timestamp()`` answer the pair's clock: a
schema of the test's own, first on the connections' search path, shadows them (production
never sets such a path, and the SQL files are run as they ship).
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import astuple
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg

from replicron.postgres._reference import ORDERED, ReferenceLedger, StatementError
from replicron.postgres._reference.server import ServerSession
from replicron.postgres._sql import queries

#: The schema whose now() and clock_timestamp() answer the test's clock.
CLOCK_SCHEMA = "replicron_test_clock"
_CLOCK = f"""
CREATE SCHEMA {CLOCK_SCHEMA};
CREATE FUNCTION {CLOCK_SCHEMA}.now() RETURNS timestamptz LANGUAGE sql STABLE AS
    $$ SELECT current_setting('replicron_test.now')::timestamptz $$;
CREATE FUNCTION {CLOCK_SCHEMA}.clock_timestamp() RETURNS timestamptz LANGUAGE sql STABLE AS
    $$ SELECT current_setting('replicron_test.now')::timestamptz $$;
ALTER TABLE replicron_runs ALTER COLUMN claimed_at SET DEFAULT {CLOCK_SCHEMA}.now();
ALTER TABLE replicron_replicas ALTER COLUMN started_at SET DEFAULT {CLOCK_SCHEMA}.now();
ALTER TABLE replicron_replicas ALTER COLUMN last_seen SET DEFAULT {CLOCK_SCHEMA}.now();
ALTER TABLE replicron_paused ALTER COLUMN paused_at SET DEFAULT {CLOCK_SCHEMA}.now();
ALTER TABLE replicron_run_requests
    ALTER COLUMN requested_at SET DEFAULT {CLOCK_SCHEMA}.clock_timestamp();
"""

#: Per statement, the columns that hold an array built from a data-modifying step's rows or
#: a catalog's: their order is the server's to choose.
UNORDERED_ARRAYS = {"heartbeat": (2, 3, 4), "lease_heartbeat": (1, 2, 3)}

#: A statement by name, the replica whose session sends it, and its parameters.
Statement = tuple[str, "Replica", dict[str, Any]]
#: What the database answers a statement it rolled back so that it be tried again: a
#: serialization failure, a deadlock.
RETRIED = ("40001", "40P01")


def _unserialized(by: dict[str, Statement], answers: tuple[Any, Any]) -> tuple[Any, Any]:
    """``answers`` of the statements ``by["a"]`` and ``by["b"]``, run at once, without the
    columns ``AT_ONCE_UNSERIALIZED`` names."""
    masked = []
    for key, answer in zip("ab", answers, strict=True):
        columns = AT_ONCE_UNSERIALIZED.get(by[key][0], ())
        if not columns or _retried(answer) or answer[:1] == ("error",):
            masked.append(answer)
            continue
        masked.append(
            [tuple(None if at in columns else v for at, v in enumerate(row)) for row in answer]
        )
    return masked[0], masked[1]


def _retried(answer: Any) -> bool:
    return bool(answer) and answer[0] == "error" and answer[1] in RETRIED


#: Per statement, the columns of its answer that may differ from every serial order when it
#: runs at the same time as another, and why that is safe. Both are read from the
#: statement's snapshot (READ COMMITTED), where the model, one statement at a time, reads
#: what the other statement committed:
#: - a heartbeat's peers: two heartbeats at once may each miss the other's row. Peers only
#:   rank the replicas for claiming ahead (one that sees none claims ahead of every tick, and
#:   the claims stay exclusive), and the next heartbeat sees them;
#: - a claim's holder of a tick it found ``locked``: a release committing meanwhile frees the
#:   job's lock, which the claim's write waits for and then takes for an earlier tick of its
#:   batch, while the later tick, locked behind it, still names the releasing replica. The
#:   status and the rows are a serial order's; the holder only words the skip.
AT_ONCE_UNSERIALIZED = {
    "heartbeat": (4,),
    "lease_heartbeat": (3,),
    "claim": (4,),
    "lease_claim": (4,),
}

#: Every table the statements write, read back whole, in a fixed order.
TABLES = {
    "replicron_runs": "SELECT * FROM replicron_runs ORDER BY run_id",
    "replicron_job_locks": "SELECT * FROM replicron_job_locks ORDER BY namespace, job",
    "replicron_leaders": "SELECT * FROM replicron_leaders ORDER BY namespace",
    "replicron_replicas": "SELECT * FROM replicron_replicas ORDER BY namespace, replica_id",
    "replicron_paused": (
        "SELECT namespace, job, paused_at, paused_by FROM replicron_paused ORDER BY namespace, job"
    ),
    "replicron_jobs": "SELECT * FROM replicron_jobs ORDER BY namespace, job, replica_id",
    "replicron_run_requests": "SELECT * FROM replicron_run_requests ORDER BY request_id",
    "replicron_pruned_runs": "SELECT * FROM replicron_pruned_runs ORDER BY namespace, job",
}


def prepare(conninfo: str) -> None:
    """The schema as it ships, and the test's clock beside it."""
    schema = resources.files("replicron.postgres").joinpath("sql/schema.sql").read_text("utf-8")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(schema.encode())  # one file, as psql would run it
        conn.execute(_CLOCK.encode())


class Replica:
    """One replica's server session on both sides: a connection and its model twin."""

    def __init__(self, conninfo: str, ledger: ReferenceLedger) -> None:
        self._conninfo = conninfo
        self._ledger = ledger
        self._connect()

    def reconnect(self) -> None:
        """A new server session on both sides (the old one ends: its locks go)."""
        self.close()
        self._connect()

    def _connect(self) -> None:
        self.token = uuid.uuid4().hex
        self.conn = psycopg.connect(self._conninfo, autocommit=True)
        self.conn.execute(f"SET search_path TO {CLOCK_SCHEMA}, pg_catalog, public")
        self.conn.execute("SELECT set_config('replicron.session_token', %s, false)", [self.token])
        [(pid,)] = self.conn.execute("SELECT pg_backend_pid()").fetchall()
        self.session = self._ledger.connect(pid, **{"replicron.session_token": self.token})

    @property
    def pid(self) -> int:
        return self.session.pid

    def close(self) -> None:
        # The server lets a closed session's locks go as its process exits, a moment later;
        # the model at once. Let go first, so that the next statement finds them gone.
        self.conn.execute("SELECT pg_advisory_unlock_all()")
        self.conn.close()
        self._ledger.disconnect(self.session)


class Pair:
    """The ledger and the database, and the replicas' sessions on both."""

    def __init__(self, conninfo: str, now: datetime, replicas: int) -> None:
        prepare(conninfo)
        self._conninfo = conninfo
        self._queries = queries()
        with psycopg.connect(conninfo) as conn:
            [self._identity] = conn.execute(
                "SELECT (SELECT system_identifier FROM pg_control_system()),"
                " ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
            ).fetchall()
        self.ledger = ReferenceLedger(now)
        self.ledger.db.identity = self._identity
        self.replicas = [Replica(conninfo, self.ledger) for _ in range(replicas)]
        #: How many statements run at once (``run_together``) waited on the other's lock.
        self.waited = 0
        self._watcher: psycopg.Connection[Any] | None = None

    def reset(self, now: datetime) -> None:
        """Both sides empty again, at ``now``, with new server sessions."""
        self.close()
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join(TABLES)}")
            conn.execute("ALTER SEQUENCE replicron_runs_run_id_seq RESTART")
            conn.execute("ALTER SEQUENCE replicron_run_requests_request_id_seq RESTART")
        self.ledger = ReferenceLedger(now)
        self.ledger.db.identity = self._identity
        self.replicas = [Replica(self._conninfo, self.ledger) for _ in self.replicas]

    @property
    def now(self) -> datetime:
        return self.ledger.db.now

    def at(self, now: datetime) -> None:
        self.ledger.db.now = now

    def run(self, name: str, on: Replica, params: dict[str, Any]) -> tuple[Any, Any]:
        """Statement ``name`` on both sides: (the database's answer, the model's), each rows
        or ``("error", sqlstate)``."""
        return self._on_the_database(name, on, params), self._on_the_model(name, on, params)

    def run_together(
        self, first: Statement, second: Statement, agree: Callable[[Any, Any], bool]
    ) -> tuple[Any, Any, str | None]:
        """Two statements on two sessions at once on the database: ``first`` in a transaction
        kept open until ``second`` has reached the server and is waiting on a lock (or is
        done), then committed. The model runs them one after the other: ``first`` then
        ``second``, else the other way round, else (when the database rolled one back as a
        serialization failure or a deadlock, which the backend tries again) the other alone.
        ``agree(database, model)`` tells whether both answers and the tables agree. Returns
        the database's two answers, the model's in the order that agreed, and that order
        (None if none did: the model treats as atomic an interleaving the SQL allows)."""
        (name_a, a, params_a), (name_b, b, params_b) = first, second
        assert a is not b, "two statements at once need two sessions"
        before = copy.deepcopy((self.ledger, [replica.session for replica in self.replicas]))
        for replica in (a, b):
            replica.conn.execute(
                "SELECT set_config('replicron_test.now', %s, false)", [self.now.isoformat()]
            )
        answers: dict[str, Any] = {}
        a.conn.execute("BEGIN")
        answers["a"] = self._statement(name_a, a, params_a)
        later = threading.Thread(
            target=lambda: answers.__setitem__("b", self._statement(name_b, b, params_b))
        )
        later.start()
        if self._until_waiting_or_done(b.pid, later):
            self.waited += 1
        a.conn.execute("ROLLBACK" if answers["a"][:1] == ("error",) else "COMMIT")
        later.join()
        database = answers["a"], answers["b"]
        orders: list[tuple[str, ...]] = [("a", "b"), ("b", "a")]
        if _retried(answers["a"]):
            orders.append(("b",))
        if _retried(answers["b"]):
            orders.append(("a",))
        for order in orders:
            self._restore(copy.deepcopy(before))
            by = {"a": (name_a, a, params_a), "b": (name_b, b, params_b)}
            # A statement the database rolled back is not run here: its answer stands.
            model = dict(zip("ab", database, strict=True))
            for key in order:
                name, on, params = by[key]
                model[key] = self._on_the_model(name, on, params)
            answers_apart = (model["a"], model["b"])
            if agree(_unserialized(by, database), _unserialized(by, answers_apart)):
                return database, answers_apart, ";".join(order)
        return database, None, None

    def _until_waiting_or_done(self, pid: int, running: threading.Thread) -> bool:
        """Until the server session ``pid`` waits on a lock (True), or its statement is over."""
        if self._watcher is None:
            self._watcher = psycopg.connect(self._conninfo, autocommit=True)
        for _ in range(2000):
            if not running.is_alive():
                return False
            [(waiting,)] = self._watcher.execute(
                "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity"
                " WHERE pid = %s",
                [pid],
            ).fetchall()
            if waiting:
                return True
            running.join(0.001)
        raise AssertionError(f"server session {pid} neither waited nor finished")

    def _restore(self, state: tuple[ReferenceLedger, list[ServerSession]]) -> None:
        ledger, sessions = state
        self.ledger = ledger
        for replica, session in zip(self.replicas, sessions, strict=True):
            replica.session, replica._ledger = session, ledger

    def _statement(self, name: str, on: Replica, params: dict[str, Any]) -> Any:
        try:
            cursor = on.conn.execute(self._queries[name], params)
        except psycopg.Error as exc:
            return ("error", exc.sqlstate)
        rows = cursor.fetchall() if cursor.description is not None else []
        return normalised(name, [tuple(row) for row in rows])

    def _on_the_database(self, name: str, on: Replica, params: dict[str, Any]) -> Any:
        on.conn.execute(
            "SELECT set_config('replicron_test.now', %s, false)", [self.now.isoformat()]
        )
        return self._statement(name, on, params)

    def _on_the_model(self, name: str, on: Replica, params: dict[str, Any]) -> Any:
        try:
            rows = self.ledger.execute(name, on.session, params)
        except StatementError as exc:
            return ("error", exc.sqlstate)
        return normalised(name, rows)

    def tables(self) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, list[tuple[Any, ...]]]]:
        """Every table on both sides: (the database's, the model's)."""
        conn = self.replicas[0].conn
        database = {name: [tuple(row) for row in conn.execute(sql)] for name, sql in TABLES.items()}
        t = self.ledger.db.tables
        model = {
            "replicron_runs": [astuple(row) for _, row in sorted(t.runs.items())],
            "replicron_job_locks": [astuple(lock) for _, lock in sorted(t.job_locks.items())],
            "replicron_leaders": [astuple(lease) for _, lease in sorted(t.leaders.items())],
            "replicron_replicas": [astuple(r) for _, r in sorted(t.replicas.items())],
            "replicron_paused": [(*key, *value) for key, value in sorted(t.paused.items())],
            "replicron_jobs": [astuple(r) for _, r in sorted(t.registrations.items())],
            "replicron_run_requests": [astuple(r) for r in t.run_requests],
            "replicron_pruned_runs": [(*key, runs) for key, runs in sorted(t.pruned_runs.items())],
        }
        return database, model

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None


def normalised(name: str, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows as a comparison needs them: arrays whose order is the server's sorted, rows in
    a multiset sorted where the statement fixes no order."""
    arrays = UNORDERED_ARRAYS.get(name, ())
    fixed = [
        tuple(
            sorted(value) if at in arrays and value is not None else value
            for at, value in enumerate(row)
        )
        for row in rows
    ]
    return fixed if name in ORDERED else sorted(fixed, key=repr)


def rows_apart(
    database: dict[str, list[tuple[Any, ...]]], model: dict[str, list[tuple[Any, ...]]]
) -> Iterator[str]:
    """Where the two sides' tables differ, one line each."""
    for table in TABLES:
        ours, theirs = model[table], database[table]
        for at in range(max(len(ours), len(theirs))):
            one = theirs[at] if at < len(theirs) else None
            other = ours[at] if at < len(ours) else None
            if one != other:
                yield f"{table}[{at}]: database {one!r}\n{' ' * len(table)}     model    {other!r}"
