"""The PostgreSQL backend under faults it meets in one process: a hung server session, a lost
session, an unreachable server, a clock ahead of the database's, a frozen lock holder.

Real server sessions are frozen with SIGSTOP (the server keeps the socket open and answers
nothing, as a hung proxy or a partition would) and terminated with ``pg_terminate_backend``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from replicron.backends.base import ClaimRequest, ClaimStatus, Release, RunRecord
from replicron.events import Outcome
from replicron.postgres import BackendUnavailableError, PostgresBackend, TransactionPoolerError
from replicron.postgres._sql import queries
from tests.helpers import poll_until
from tests.postgres.test_postgres_backend import claim, record, session_pid, sql, tick

CLAIMED, LOCKED, EARLY = ClaimStatus.CLAIMED, ClaimStatus.LOCKED, ClaimStatus.EARLY


@asynccontextmanager
async def opened(
    dsn: str, replica_id: str, lost: list[int] | None = None, **options: object
) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(dsn, **options)  # type: ignore[arg-type]
    await backend.open(replica_id, None if lost is None else lost.extend)
    try:
        yield backend
    finally:
        await backend.close()


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The server process stops: its socket stays open, nothing answers."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_until_gone(dsn: str, pid: int) -> None:
    """Wait until the server process of a session given up has ended: thawed, it notices
    its client is gone a moment later, and until then two sessions carry the replica's
    name."""
    poll_until(
        f"server process {pid} to end",
        lambda: not sql(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]) or None,
        timeout=10,
    )


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("freezing a server process needs root")


def test_a_hung_session_misses_its_deadline_and_the_statement_is_retried(dsn: str) -> None:
    need_root()

    async def main() -> None:
        lost: list[int] = []
        options = {"heartbeat_interval": 3600, "statement_timeout": 0.5}
        async with opened(dsn, "replica-a", lost, **options) as a:
            run = await claim(a, "cleanup", 1, lock=True)
            pid = session_pid(dsn, "replica-a")
            with frozen(pid):
                started = time.monotonic()
                # The claim waits 0.5 s for the frozen session, gives it up (its run's lock is
                # lost with it) and succeeds on a new session.
                second = await claim(a, "report", 1, lock=False)
                took = time.monotonic() - started
            assert second.status is CLAIMED
            assert 0.5 <= took < 3.0
            assert lost == [run.run_id]
            wait_until_gone(dsn, pid)
            assert session_pid(dsn, "replica-a") != pid

    asyncio.run(main())


def test_the_lease_stops_runs_before_other_replicas_may_take_the_job(dsn: str) -> None:
    """Heartbeats stop getting through: the run is told to stop within the lease, measured
    from when its last proof of life was sent, before its row goes stale for the others."""
    need_root()

    async def main() -> None:
        lost: list[int] = []
        options = {"heartbeat_interval": 0.3, "stale_after": 1.5}
        async with opened(dsn, "replica-a", lost, **options) as a:
            assert a.lease == pytest.approx(1.2)
            run = await claim(a, "cleanup", 1, lock=True)
            await asyncio.sleep(0.7)  # a heartbeat or two got through
            pid = session_pid(dsn, "replica-a")
            with frozen(pid):
                frozen_at = time.monotonic()
                while not lost and time.monotonic() - frozen_at < 5:
                    await asyncio.sleep(0.02)
                told = time.monotonic()
            assert lost == [run.run_id]
            [(beat_age,)] = sql(
                dsn,
                "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at)"
                " FROM replicron_runs WHERE run_id = %s",
                [run.run_id],
            )
            # Told to stop while the row was fresh for the others, by a margin.
            told_age = float(beat_age) - (time.monotonic() - told)
            assert told_age < 1.5 - 0.2, told_age

    asyncio.run(main())


def cut_off(dsn: str, backend: PostgresBackend, replica: str) -> str:
    """End ``replica``'s session, and make every new one fail (its conninfo points nowhere);
    returns the conninfo that works."""
    assert backend._session is not None
    good, backend._session.conninfo = backend._session.conninfo, "host=127.0.0.1 port=1 dbname=x"
    sql(dsn, "SELECT pg_terminate_backend(%s, 5000)", [session_pid(dsn, replica)])
    return good


def test_an_outcome_that_cannot_be_written_is_kept_and_written_later(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=0.2) as a:
            run = await claim(a, "cleanup", 1, lock=True)
            good = cut_off(dsn, a, "replica-a")
            # The session is gone and no new one can be made: the outcome waits.
            await a.release([Release(record(run, "replica-a"), True)])
            [(outcome, beat)] = sql(
                dsn,
                "SELECT outcome, heartbeat_at FROM replicron_runs WHERE run_id = %s",
                [run.run_id],
            )
            assert outcome is None
            await asyncio.sleep(0.5)
            [(_, beat_later)] = sql(
                dsn,
                "SELECT outcome, heartbeat_at FROM replicron_runs WHERE run_id = %s",
                [run.run_id],
            )
            assert beat_later == beat  # a finished run is never heartbeated again
            assert a._session is not None
            a._session.conninfo = good  # the server is back: the next heartbeat writes it
            for _ in range(100):
                [(outcome,)] = sql(
                    dsn, "SELECT outcome FROM replicron_runs WHERE run_id = %s", [run.run_id]
                )
                if outcome is not None:
                    break
                await asyncio.sleep(0.05)
            assert outcome == "succeeded"

    # At DEBUG: the scheduler says once that the database is unavailable.
    with caplog.at_level(logging.DEBUG, "replicron"):
        asyncio.run(main())
    assert "outcomes wait to be written" in caplog.text


def test_outcomes_still_unwritten_at_close_are_logged_with_their_ticks(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            run = await claim(a, "cleanup", 1, lock=True)
            cut_off(dsn, a, "replica-a")
            await a.release([Release(record(run, "replica-a"), True)])

    with caplog.at_level(logging.ERROR, "replicron"):
        asyncio.run(main())
    assert f"tick {tick(1).isoformat()}: could not record succeeded" in caplog.text


def test_an_outcome_written_on_another_server_session_is_not_said_lost_at_close(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A release that ran on another server session than the lock session's (a transaction
    pooler) wrote its outcomes: coordination ends there, but nothing is kept to be written
    again, and close does not report them lost."""

    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            run = await claim(a, "cleanup", 1, lock=True)
            assert a._session is not None
            a._session._token = "another server session's"  # what the release will find
            with pytest.raises(TransactionPoolerError):
                await a.release([Release(record(run, "replica-a"), True)])
            [(outcome,)] = sql(
                dsn, "SELECT outcome FROM replicron_runs WHERE run_id = %s", [run.run_id]
            )
            assert outcome == "succeeded"

    with caplog.at_level(logging.ERROR, "replicron"):
        asyncio.run(main())
    assert "transaction pooler" in caplog.text
    assert "could not record" not in caplog.text


def test_a_retried_claim_recognises_the_rows_its_first_try_inserted(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600):
            pass  # migrated

    asyncio.run(main())
    params = {
        "namespace": "",
        "jobs": ["cleanup", "report"],
        "ticks": [tick(1), tick(1)],
        "keys": [1, 2],
        "locks": [False, False],
        "manual": [False, False],
        "limits": [None, None],
        "replica": "replica-a",
        "tokens": [uuid.uuid4()] * 2,
        "ahead": timedelta(0),
        "stale_after": timedelta(seconds=15),
    }
    claim_sql = queries()["claim"]
    rows_first = _claim_on_one_session(dsn, claim_sql, params)
    rows_again = _claim_on_one_session(dsn, claim_sql, params)
    other = _claim_on_one_session(dsn, claim_sql, {**params, "tokens": [uuid.uuid4()] * 2})
    assert [r[2:4] for r in rows_first] == [(r[2], "claimed") for r in rows_first]
    assert rows_again == rows_first  # the same rows, recognised by the token
    assert [r[3] for r in other] == ["taken", "taken"]  # another claimant's


def test_claims_of_overlapping_ticks_sent_in_opposite_orders_do_not_deadlock(dsn: str) -> None:
    # Replicas try a burst's ticks in orders of their own. An insert waits for another
    # transaction's uncommitted row of the same tick, so two claims that insert in their own
    # orders can each wait for the other. A third session holds a row each claim needs in
    # the middle, until both claims are waiting; then they go on.
    async def migrate() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600):
            pass

    asyncio.run(migrate())
    claim_sql = queries()["claim"].encode()

    def params(jobs: list[str]) -> dict[str, object]:
        return {
            "namespace": "",
            "jobs": jobs,
            "ticks": [tick(1)] * len(jobs),
            "keys": list(range(len(jobs))),
            "locks": [False] * len(jobs),
            "manual": [False] * len(jobs),
            "limits": [None] * len(jobs),
            "replica": "replica",
            "tokens": [uuid.uuid4() for _ in jobs],
            "ahead": timedelta(0),
            "stale_after": timedelta(seconds=15),
        }

    def session(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, object]:
        [(pid, token)] = conn.execute(
            "SELECT pg_backend_pid(), set_config('replicron.session_token', 'test', false)"
        ).fetchall()
        return {"pid": pid, "session_token": token}

    answers: dict[str, list[tuple[object, ...]]] = {}
    failures: list[BaseException] = []
    pids: list[int] = []

    def claimant(name: str, jobs: list[str]) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                own = session(conn)
                pids.append(int(own["pid"]))  # type: ignore[call-overload]
                rows = conn.execute(claim_sql, {**params(jobs), **own}).fetchall()
                answers[name] = [tuple(row) for row in rows]
        except BaseException as error:  # reported by the asserts below
            failures.append(error)

    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as watcher:
        holder.execute(claim_sql, {**params(["z-held-1", "z-held-2"]), **session(holder)})
        threads = [
            threading.Thread(target=claimant, args=("a", ["a", "z-held-1", "b"])),
            threading.Thread(target=claimant, args=("b", ["b", "z-held-2", "a"])),
        ]
        for thread in threads:
            thread.start()

        def both_waiting() -> bool:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE pid = ANY(%s) AND wait_event_type = 'Lock'",
                (pids,),
            ).fetchone()
            return len(pids) == 2 and waiting is not None and waiting[0] == 2

        poll_until("both claims waiting", both_waiting, 20)
        holder.rollback()
        for thread in threads:
            thread.join(30)
    assert failures == []
    won = {
        (str(row[0]), name) for name, rows in answers.items() for row in rows if row[3] == "claimed"
    }
    assert sorted(job for job, _ in won) == ["a", "b", "z-held-1", "z-held-2"]  # each once
    assert ("z-held-1", "a") in won
    assert ("z-held-2", "b") in won


def _claim_on_one_session(
    dsn: str, query: str, params: dict[str, object]
) -> list[tuple[object, ...]]:
    """Run the claim on a connection of its own, as the lock session would (its own pid)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(pid, token)] = conn.execute(
            "SELECT pg_backend_pid(), set_config('replicron.session_token', 'test', false)"
        ).fetchall()
        cursor = conn.execute(query.encode(), {**params, "pid": pid, "session_token": token})
        return [tuple(row) for row in cursor.fetchall()]


def test_a_tick_not_yet_due_by_the_database_clock_is_refused_and_not_recorded(
    dsn: str,
) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            [(now,)] = sql(dsn, "SELECT clock_timestamp()")
            soon, later = now + timedelta(milliseconds=100), now + timedelta(seconds=30)
            claims = await a.claim(
                [ClaimRequest("report", soon, False), ClaimRequest("cleanup", later, True)]
            )
            assert [c.status for c in claims] == [CLAIMED, EARLY]  # within the margin: fine
            assert claims[1].run_id is None
            assert sql(dsn, "SELECT job FROM replicron_runs ORDER BY job") == [("report",)]
            assert sql(
                dsn,
                "SELECT count(*) FROM pg_locks"
                " WHERE locktype = 'advisory'"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            ) == [(0,)]
            offset = a.clock_offset()
            assert offset is not None
            assert abs(offset.total_seconds()) < 0.1  # one host, one clock

    asyncio.run(main())


@pytest.mark.parametrize("fence", [False, True])
def test_a_frozen_holder_blocks_the_job_is_warned_about_and_can_be_fenced(
    dsn: str, fence: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        lost: list[int] = []
        async with (
            opened(dsn, "replica-a", lost, heartbeat_interval=3600) as a,
            opened(dsn, "replica-b", heartbeat_interval=3600, fence_stale_holders=fence) as b,
        ):
            run = await claim(a, "cleanup", 1, lock=True)
            # a stops heartbeating (frozen) while its session still holds the lock.
            sql(
                dsn,
                "UPDATE replicron_runs SET heartbeat_at = now() - interval '3 hours'"
                " WHERE run_id = %s",
                [run.run_id],
            )
            blocked = await claim(b, "cleanup", 2, lock=True)
            assert blocked.status is LOCKED
            await b.release([Release(record(blocked, "replica-b", Outcome.SKIPPED_OVERLAP), False)])
            status = {s.job: s for s in await b.status()}["cleanup"]
            # Fenced, a's session is gone with its lock: its run blocks nothing any more.
            frozen = () if fence else (("replica-a", run.run_id),)
            assert status.stale_running == frozen
            next_claim = await claim(b, "cleanup", 3, lock=True)
            assert next_claim.status is (CLAIMED if fence else LOCKED)
            if not fence:
                await b.release(
                    [Release(record(next_claim, "replica-b", Outcome.SKIPPED_OVERLAP), False)]
                )

    with caplog.at_level(logging.WARNING, "replicron"):
        asyncio.run(main())
    assert "is blocked by replica replica-a: its heartbeat is stale" in caplog.text


def test_the_clock_offset_is_measured_against_the_database(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=0.1) as a:
            await asyncio.sleep(0.35)
            offset = a.clock_offset()
            assert offset is not None
            assert abs(offset) < timedelta(milliseconds=50)
            [(ms,)] = sql(dsn, "SELECT clock_offset_ms FROM replicron_replicas")
            assert abs(ms) < 50
            [replica] = await a.replicas()
            assert (replica.replica_id, replica.alive) == ("replica-a", True)
            assert replica.last_seen <= datetime.now(UTC) + timedelta(seconds=1)

    asyncio.run(main())


def test_statements_fail_fast_when_the_server_is_unreachable(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            assert a._session is not None
            a._session.conninfo = "host=127.0.0.1 port=1 dbname=x"
            sql(dsn, "SELECT pg_terminate_backend(%s, 5000)", [session_pid(dsn, "replica-a")])
            with pytest.raises(BackendUnavailableError):
                await claim(a, "cleanup", 1, lock=True)

    asyncio.run(main())


def test_refused_ticks_are_not_heartbeated_once_recorded(dsn: str) -> None:
    """A tick refused as LOCKED is recorded skipped_overlap at once; the replica must not keep
    it among the runs it heartbeats (they would pile up for as long as the job is blocked)."""

    async def main() -> None:
        async with (
            opened(dsn, "replica-a", heartbeat_interval=3600) as a,
            opened(dsn, "replica-b", heartbeat_interval=3600) as b,
        ):
            await claim(a, "cleanup", 1, lock=True)
            for n in (2, 3, 4):
                refused = await claim(b, "cleanup", n, lock=True)
                assert refused.status is LOCKED
                skipped = record(refused, "replica-b", Outcome.SKIPPED_OVERLAP)
                await b.release([Release(skipped, False)])
            assert b._runs.to_heartbeat() == []
            rows = sql(dsn, "SELECT outcome, count(*) FROM replicron_runs GROUP BY 1 ORDER BY 1")
            assert rows == [("skipped_overlap", 3), (None, 1)]

    asyncio.run(main())


def _insert_lost_claim(dsn: str, job: str, n: int, token: uuid.UUID) -> int:
    """The row a claim inserted and committed when its answer was lost with the connection
    (its replica never learnt it won the tick): started, heartbeat as of then."""
    [(run_id,)] = sql(
        dsn,
        "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id, heartbeat_at,"
        " started_at, claim_token) VALUES ('', %s, %s, 'replica-a', now() - interval '10 s',"
        " now() - interval '10 s', %s) RETURNING run_id",
        [job, tick(n), token],
    )
    return int(run_id)


def test_a_tick_whose_claim_answer_was_lost_is_recognised_and_refreshed(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            token = uuid.uuid4()
            run_id = _insert_lost_claim(dsn, "cleanup", 1, token)
            a._tokens.remember([("cleanup", tick(1))], [token])  # what the failed claim left
            again = await claim(a, "cleanup", 1, lock=True)
            assert (again.status, again.run_id, again.locked) == (CLAIMED, run_id, True)
            [(age,)] = sql(
                dsn,
                "SELECT extract(epoch FROM now() - heartbeat_at) FROM replicron_runs"
                " WHERE run_id = %s",
                [run_id],
            )
            assert float(age) < 1.0  # its lease starts now, and so does its row's freshness
            assert not a._tokens

    asyncio.run(main())


def test_a_lost_claim_is_recorded_when_its_tick_is_written_off_or_at_close(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            for n in (1, 2):
                token = uuid.uuid4()
                _insert_lost_claim(dsn, "cleanup", n, token)
                a._tokens.remember([("cleanup", tick(n))], [token])
            # Tick 1 is handled again after the failure and written off as missed.
            missed = RunRecord(
                "cleanup",
                tick(1),
                Outcome.MISSED,
                "replica-a",
                None,
                None,
                None,
                "the backend was unreachable",
            )
            assert await a.record_unclaimed([missed]) == [True]
        # Tick 2 never came up again: the backend records it at close.

    asyncio.run(main())
    rows = sql(dsn, "SELECT scheduled_at, outcome, error FROM replicron_runs ORDER BY 1")
    assert [(t, outcome) for t, outcome, _ in rows] == [(tick(1), "missed"), (tick(2), "missed")]
    assert "answer was lost" in rows[1][2]


def test_lost_claims_in_a_range_are_recorded_with_it_and_the_range_starts_after_them(
    dsn: str,
) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            for n in (1, 5):  # the claims in flight when the connection went, then resynced
                token = uuid.uuid4()
                _insert_lost_claim(dsn, "cleanup", n, token)
                a._tokens.remember([("cleanup", tick(n))], [token])
            span = RunRecord(
                "cleanup",
                tick(1),
                Outcome.MISSED,
                "replica-a",
                None,
                None,
                None,
                "the backend was unreachable",
                through=tick(20),
                ticks=20,
                starts=tuple(tick(n) for n in range(1, 9)),
            )
            # The range stands for the 18 ticks without rows; the two lost claims are
            # recorded missed by their tokens with it.
            assert await a.record_unclaimed([span]) == [20]
            assert not a._tokens

    asyncio.run(main())
    rows = sql(
        dsn,
        "SELECT scheduled_at, scheduled_through, ticks, outcome FROM replicron_runs ORDER BY 1",
    )
    assert rows == [
        (tick(1), None, 1, "missed"),
        (tick(2), tick(20), 18, "missed"),
        (tick(5), None, 1, "missed"),
    ]


def _write_off(dsn: str, job: str, n: int) -> None:
    """What a janitor does to the row of a lost claim once its heartbeat is stale."""
    sql(dsn, queries()["abandon_stale"], {"namespace": "", "stale_after": timedelta(seconds=1)})
    [(outcome,)] = sql(
        dsn,
        "SELECT outcome FROM replicron_runs WHERE job = %s AND scheduled_at = %s",
        [job, tick(n)],
    )
    assert outcome == "abandoned"


def test_a_lost_claim_written_off_by_a_janitor_is_still_its_claimants(dsn: str) -> None:
    # The claim committed, its answer was lost, and a janitor recorded the row abandoned
    # before the claimant asked again. Nothing ran it: asked again it is the claimant's (one
    # row, run once), not "taken"; never asked again, it is recorded missed at close; in
    # neither case is it counted as a run of a limited job.
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            tokens = {n: uuid.uuid4() for n in (1, 2, 3)}
            run_id = _insert_lost_claim(dsn, "cleanup", 1, tokens[1])
            _insert_lost_claim(dsn, "cleanup", 2, tokens[2])
            _insert_lost_claim(dsn, "cleanup", 3, tokens[3])
            for n in (1, 2, 3):
                a._tokens.remember([("cleanup", tick(n))], [tokens[n]])
                _write_off(dsn, "cleanup", n)
            [again] = await a.claim([ClaimRequest("cleanup", tick(1), True, max_runs=1)])
            assert (again.status, again.run_id, again.locked) == (CLAIMED, run_id, True)
            await a.release([Release(record(again, "replica-a"), True)])
            missed = RunRecord(
                "cleanup",
                tick(2),
                Outcome.MISSED,
                "replica-a",
                None,
                None,
                None,
                "the backend was unreachable",
            )
            assert await a.record_unclaimed([missed]) == [True]
        # Tick 3 never came up again: recorded missed at close.

    asyncio.run(main())
    rows = sql(dsn, "SELECT scheduled_at, outcome FROM replicron_runs ORDER BY 1")
    assert rows == [(tick(1), "succeeded"), (tick(2), "missed"), (tick(3), "missed")]


def test_runs_pruned_by_retention_still_count_against_max_runs(dsn: str) -> None:
    async def main() -> list[ClaimStatus]:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            for n, outcome in [(1, "succeeded"), (2, "missed"), (3, "failed"), (4, "succeeded")]:
                sql(
                    dsn,
                    "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id,"
                    " claimed_at, outcome) VALUES ('', 'report', %s, 'r',"
                    " now() - interval '30 days', %s)",
                    [tick(n), outcome],
                )
            await a._housekeeper.janitor()
            claims = await a.claim(
                [
                    ClaimRequest("report", tick(5), False, max_runs=3),  # 2 pruned + tick 4
                    ClaimRequest("sync", tick(5), False, max_runs=3),
                ]
            )
            return [c.status for c in claims]

    assert asyncio.run(main()) == [ClaimStatus.EXHAUSTED, CLAIMED]
    left = sql(dsn, "SELECT job, scheduled_at FROM replicron_runs ORDER BY 1, 2")
    assert left == [("report", tick(4)), ("sync", tick(5))]
    assert sql(dsn, "SELECT namespace, job, runs FROM replicron_pruned_runs") == [("", "report", 2)]


def test_a_tick_not_yet_due_by_the_database_is_not_written_off(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "replica-a", heartbeat_interval=3600) as a:
            [(now,)] = sql(dsn, "SELECT clock_timestamp()")
            ahead = RunRecord(
                "cleanup",
                now + timedelta(seconds=30),
                Outcome.MISSED,
                "replica-a",
                None,
                None,
                None,
                "a later tick was due",
            )
            due = ahead._replace(scheduled_at=now - timedelta(seconds=30))
            assert await a.record_unclaimed([ahead, due]) == [None, True]
            assert sql(dsn, "SELECT count(*) FROM replicron_runs") == [(1,)]

    asyncio.run(main())


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_connect_timeout_says_that_no_answer_came(coordination: Any) -> None:
    """A server that accepts the TCP connection and never answers (a hung host, a stalled
    proxy): the one line says so, rather than ending at "cannot connect to PostgreSQL: "."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; nobody ever answers
        port = silent.getsockname()[1]
        backend = PostgresBackend(
            f"postgresql://postgres@127.0.0.1:{port}/db",
            connect_timeout=0.5,
            coordination=coordination,
        )
        with pytest.raises(BackendUnavailableError) as caught:
            asyncio.run(backend.open("r1"))
    assert str(caught.value) == (
        "cannot connect to PostgreSQL: no answer within 0.5 s (connect_timeout)"
    )
