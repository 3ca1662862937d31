"""What a replica leaves on the server when statements cannot finish, and how long it takes to
get a new session, with real daemons (``python -m replicron run``, default replica id) on
the suite's PostgreSQL.

* Another session holds ``LOCK TABLE replicron_runs IN ACCESS EXCLUSIVE MODE`` for several
  statement deadlines: every statement of the replica waits behind it and is given up on. The
  server must end each one by the same deadline (closing the client's socket does not end a
  wait for a lock, and behind a transaction pooler no session setting holds), so the
  replica never has more than two server backends, in either mode, directly and through
  pgbouncer in transaction mode.
* A delaying forwarder makes the link slow; the replica's lock session is terminated. The
  new session has one total deadline of a heartbeat interval, so no heartbeat waits behind
  it longer than that, and it takes one connection slot: the pooler probe is start-up's.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable
from datetime import datetime

import psycopg
import pytest

from tests._harness.daemons import Daemons, config_text
from tests._harness.processes import Child
from tests.faults.cluster import Database
from tests.faults.pooler import PgBouncers
from tests.faults.proxy import HangingProxy

Summary = Callable[[str], None]

#: A job every second, so that claims come between the heartbeats.
JOB: dict[str, object] = {"name": "tick", "every": "1s", "command": ["true"]}
#: The ledger a replica writes every claim to.
LEDGER = "replicron_runs"


def start_daemon(
    daemons: Daemons, dsn: str, job: dict[str, object] = JOB, **settings: object
) -> Child:
    """One daemon on ``dsn`` running ``job``, with the replica id it picks itself; returns
    once it has started its scheduler."""
    daemon = daemons.start("d1", config_text({"database_url": dsn, **settings}, [job]))
    daemon.wait_log("started replica", 30)
    return daemon


def lock_session_name(daemon: Child) -> str:
    """The ``application_name`` of the daemon's connections: its default replica id."""
    return f"replicron {socket.gethostname()}:{daemon.pid}"[:63]


def backends(db: Database, spare: list[int]) -> list[tuple[int, str, str]]:
    """(pid, application_name, state) of every session of the test's database but the test's
    own and those in ``spare``."""
    rows = db.rows(
        "SELECT pid, application_name, state FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> ALL(%s)",
        (spare,),
    )
    return [(int(pid), str(app), str(state)) for pid, app, state in rows]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("coordination", "via"),
    [("advisory", "direct"), ("lease", "direct"), ("lease", "pgbouncer transaction mode")],
)
def test_a_locked_ledger_leaves_at_most_two_backends_per_replica(
    request: pytest.FixtureRequest,
    daemons: Daemons,
    db: Database,
    summary: Summary,
    coordination: str,
    via: str,
) -> None:
    """The ledger locked for 4 s, eight statement deadlines (heartbeat 0.5 s: a deadline of
    0.5 s): the replica's server backends are counted every 20 ms. Before, each statement the
    replica gave up on stayed on the server, waiting for the lock, for as long as it was
    held (lease mode: 1 → 13 backends in 6 s)."""
    dsn = db.dsn
    if via != "direct":
        bouncers = request.getfixturevalue("pgbouncers")
        assert isinstance(bouncers, PgBouncers)
        dsn = bouncers.transaction.dsn(db.name)
    daemon = start_daemon(daemons, dsn, coordination=coordination, heartbeat_interval="500ms")
    time.sleep(1.0)  # a few claims and heartbeats first
    seen: list[tuple[int, str, str]] = []
    most = 0
    with psycopg.connect(db.dsn, application_name="faults holder") as holder:
        holder.execute(f"LOCK TABLE {LEDGER} IN ACCESS EXCLUSIVE MODE")
        spare = [holder.info.backend_pid]
        locked = time.monotonic()
        while time.monotonic() - locked < 4.0:
            now = backends(db, spare)
            if len(now) > most:
                most, seen = len(now), now
            time.sleep(0.02)
        waiting = backends(db, spare)
        ran = len(daemon.lines("succeeded"))
        holder.rollback()
    daemon.wait_log("succeeded", 10, count=ran + 1)  # and it runs again
    summary(
        f"[ledger locked 4 s, {coordination} mode, {via}] most backends of the replica at once="
        f"{most} {seen} | at the end of the lock={len(waiting)}"
    )
    assert most <= 2, seen


def heartbeat_gaps(db: Database, watch: Callable[[], bool]) -> list[float]:
    """The replica's heartbeats as the database stamped them (``last_seen``), read every
    20 ms while ``watch`` says so; the gaps between them (seconds)."""
    stamps: list[datetime] = []
    while watch():
        for (seen,) in db.rows("SELECT last_seen FROM replicron_replicas"):
            if not stamps or seen > stamps[-1]:
                stamps.append(seen)
        time.sleep(0.02)
    return [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]


@pytest.mark.timeout(120)
def test_a_new_lock_session_over_a_slow_link_keeps_the_heartbeats_going(
    daemons: Daemons, db: Database, summary: Summary
) -> None:
    """Advisory mode through a forwarder that adds 150 ms each way (a 300 ms round trip),
    heartbeat every 2 s; the lock session is terminated right after a heartbeat. The next
    statement finds it gone (a heartbeat is not retried: the one after it opens the new
    session); the new session must be ready within a heartbeat interval (before: a round
    trip per session setting, then a probe connection, about 5 s), on one connection."""
    heartbeat = 2.0
    proxy = HangingProxy(("127.0.0.1", db.cluster.port))
    try:
        # A job seldom due: over this link, claims every second would keep the session busy
        # enough to delay heartbeats by themselves.
        job = {**JOB, "every": "10s"}
        daemon = start_daemon(
            daemons, proxy.dsn(db.name), job, heartbeat_interval=f"{heartbeat:g}s"
        )
        name = lock_session_name(daemon)
        proxy.delay = 0.15
        time.sleep(heartbeat)  # a heartbeat over the slow link first
        [(first,)] = db.rows("SELECT last_seen FROM replicron_replicas")
        db.wait_until(
            "a heartbeat",
            lambda: db.rows("SELECT last_seen FROM replicron_replicas")[0][0] > first,
            2 * heartbeat,
            every=0.01,
        )
        [old] = [pid for pid, app, _ in backends(db, []) if app == name]
        db.rows("SELECT pg_terminate_backend(%s)", (old,))
        cut = time.monotonic()
        opened: set[int] = set()

        def watching() -> bool:
            opened.update(pid for pid, app, _ in backends(db, [old]) if app == name)
            return time.monotonic() - cut < 4 * heartbeat

        gaps = heartbeat_gaps(db, watching)
    finally:
        proxy.close()
    summary(
        f"[lock session terminated, 300 ms round trip, heartbeat {heartbeat:g} s] longest "
        f"heartbeat gap={max(gaps):.2f} s (all: {', '.join(f'{g:.2f}' for g in gaps)}) | "
        f"connections the replica opened={len(opened)}"
    )
    # Heartbeats come every interval plus a round trip; one may fail on the lost session, and
    # the next wait behind the new one for one interval more, no longer.
    assert max(gaps) <= 3 * heartbeat + 2 * 0.3, gaps
    assert len(opened) == 1, opened
