"""Lease mode on a real server: the row and the job's lock row are the locks.

What differs from advisory mode, shown statement by statement on backends driven directly
(their housekeeping never runs by itself here: ``heartbeat_interval=3600``): leases expire on
the database's clock, a written-off row fences its late writer by its epoch, an expired job
lock is taken over and its holder told to stop at its next heartbeat, a lost connection loses
nothing, the modes do not mix in a namespace, and a replica among peers claims an instant's
ticks in one statement that tries none of those already with a row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from psycopg_pool import AsyncConnectionPool

from replicron.backends.base import ClaimRequest, ClaimStatus, RunRecord
from replicron.errors import ConfigurationError
from replicron.events import Outcome
from replicron.postgres import CoordinationMode, MixedModesError, PostgresBackend
from tests.postgres.test_postgres_backend import claim, opened, record, release, sql, tick

CLAIMED, TAKEN = ClaimStatus.CLAIMED, ClaimStatus.TAKEN
T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(main)


def expire(dsn: str, job: str) -> None:
    """The job's open rows and its lock row run out of lease, as if their replica froze."""
    sql(
        dsn,
        "UPDATE replicron_runs SET lease_until = now() - interval '1 second'"
        " WHERE job = %s AND outcome IS NULL",
        [job],
    )
    sql(
        dsn,
        "UPDATE replicron_job_locks SET lease_until = now() - interval '1 second' WHERE job = %s",
        [job],
    )


def row(dsn: str, run_id: int | None) -> tuple[Any, ...]:
    [found] = sql(
        dsn,
        "SELECT outcome, epoch, lease_until IS NOT NULL FROM replicron_runs WHERE run_id = %s",
        [run_id],
    )
    return tuple(found)


def lock_row(dsn: str, job: str) -> tuple[Any, ...]:
    [found] = sql(
        dsn, "SELECT run_id, replica_id, epoch FROM replicron_job_locks WHERE job = %s", [job]
    )
    return tuple(found)


def test_a_claim_holds_a_lease_on_the_database_clock_and_no_advisory_lock(dsn: str) -> None:
    async def main() -> None:
        async with opened(dsn, "a", coordination="lease", stale_after=7200) as a:
            won = await claim(a, "report", 1, lock=True)
            assert (won.status, won.locked) == (CLAIMED, True)
            [(lease_left,)] = sql(
                dsn,
                "SELECT extract(epoch FROM lease_until - now()) FROM replicron_runs"
                " WHERE run_id = %s",
                [won.run_id],
            )
            assert 7190 < lease_left <= 7200
            assert lock_row(dsn, "report") == (won.run_id, "a", 1)
            assert sql(
                dsn,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())",
            ) == [(0,)]
            await release(a, record(won, "a"), unlock=True)
            assert row(dsn, won.run_id) == ("succeeded", 0, False)
            assert lock_row(dsn, "report") == (None, None, 1)

    run(main())


def test_a_written_off_row_fences_its_late_writer(dsn: str) -> None:
    """A janitor writes off a row whose lease ran out in a new epoch: its claimant, writing
    later from the old epoch, records nothing over it, and the job's lock is free again."""

    async def main() -> None:
        async with (
            opened(dsn, "a", coordination="lease") as a,
            opened(dsn, "b", coordination="lease") as b,
        ):
            late = await claim(a, "report", 1, lock=True)
            expire(dsn, "report")
            await b._housekeeper.janitor()
            assert row(dsn, late.run_id) == ("abandoned", 1, False)
            await release(a, record(late, "a", Outcome.SUCCEEDED), unlock=True)
            assert row(dsn, late.run_id) == ("abandoned", 1, False)
            following = await claim(b, "report", 2, lock=True)
            assert (following.status, following.locked) == (CLAIMED, True)

    run(main())


def test_a_written_off_row_ends_at_its_lease_and_its_writer_agreeing_is_no_error(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The run fenced itself at its lease's end, so the row says it finished then (not when
    the janitor came by: a takeover may have started in between); the late writer recording
    the same ``abandoned`` is told so at INFO, not as an error."""

    async def main() -> None:
        async with (
            opened(dsn, "a", coordination="lease") as a,
            opened(dsn, "b", coordination="lease") as b,
        ):
            late = await claim(a, "report", 1, lock=True)
            expire(dsn, "report")
            [(lease_end,)] = sql(
                dsn, "SELECT lease_until FROM replicron_runs WHERE run_id = %s", [late.run_id]
            )
            await b._housekeeper.janitor()
            [(finished,)] = sql(
                dsn, "SELECT finished_at FROM replicron_runs WHERE run_id = %s", [late.run_id]
            )
            assert finished == lease_end
            with caplog.at_level("INFO", logger="replicron"):
                await release(a, record(late, "a", Outcome.ABANDONED), unlock=True)
            assert row(dsn, late.run_id) == ("abandoned", 1, False)

    run(main())
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "already" in r.getMessage()]
    assert [level for level, _ in said] == ["INFO"], said
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert any("lease had ended" in r.getMessage() for r in caplog.records)
    assert {r.name for r in caplog.records if r.levelno >= 20} == {"replicron.postgres.backend"}


def test_an_expired_lock_is_taken_over_and_its_holder_told_to_stop(dsn: str) -> None:
    async def main() -> None:
        lost: list[int] = []
        async with (
            opened(dsn, "a", lost, coordination="lease") as a,
            opened(dsn, "b", coordination="lease") as b,
        ):
            frozen = await claim(a, "report", 1, lock=True)
            refused = await claim(b, "report", 2, lock=True)
            assert refused.status is ClaimStatus.LOCKED  # the lease is live: no overlap
            expire(dsn, "report")
            taker = await claim(b, "report", 3, lock=True)
            assert (taker.status, taker.locked) == (CLAIMED, True)
            assert lock_row(dsn, "report") == (taker.run_id, "b", 2)
            await a._housekeeper.heartbeat()  # the holder wakes: its lock is another's now
            assert lost == [frozen.run_id]
            await release(a, record(frozen, "a", Outcome.ABANDONED), unlock=True)
            assert lock_row(dsn, "report") == (taker.run_id, "b", 2)  # not freed by the loser

    run(main())


def test_a_lost_connection_loses_no_run(dsn: str) -> None:
    async def main() -> None:
        lost: list[int] = []
        async with opened(dsn, "a", lost, coordination="lease") as a:
            held = await claim(a, "report", 1, lock=True)
            sql(
                dsn,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'replicron a'",
            )
            await a._housekeeper.heartbeat()  # on a new connection, renewing the same leases
            assert lost == []
            assert lock_row(dsn, "report")[0] == held.run_id
            await release(a, record(held, "a"), unlock=True)
            assert row(dsn, held.run_id)[0] == "succeeded"

    run(main())


def test_replicas_of_one_namespace_must_agree_on_the_mode(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with opened(dsn, "a", coordination="advisory"):
            with pytest.raises(ConfigurationError, match=r"a \(advisory\)"):
                async with opened(dsn, "b", coordination="lease"):
                    pass
            async with opened(dsn, "c", coordination="lease", namespace="other/"):
                pass

    run(main())
    # Refused at start it does not start: no word of waiting for the others to go.
    assert "claiming nothing until" not in caplog.text


#: Timing short enough to wait out a replica going stale in real time.
QUICK: dict[str, Any] = {"heartbeat_interval": 0.1, "stale_after": 0.6, "statement_timeout": 0.4}


def missed(job: str, n: int) -> RunRecord:
    return RunRecord(job, tick(n), Outcome.MISSED, "a", None, None, None, "unreachable")


async def gone(backend: PostgresBackend) -> None:
    """The replica's heartbeats stop getting through (as for a frozen process or a partition)
    until the others count it gone, on the database's clock and on its own."""
    await backend._housekeeper.stop()
    await asyncio.sleep(backend.stale_after + 0.1)


@pytest.mark.parametrize(("first", "second"), [("lease", "advisory"), ("advisory", "lease")])
def test_a_replica_back_after_being_counted_gone_claims_nothing_beside_the_other_mode(
    dsn: str, first: CoordinationMode, second: CoordinationMode
) -> None:
    """While a replica was gone, one of the other mode joined the namespace (nobody live was
    in its way): the one that came back claims nothing, and records nothing, while the other
    lives, and claims again once it has stopped."""

    async def main() -> None:
        async with opened(dsn, "a", coordination=first, **QUICK) as a:
            await gone(a)
            b = PostgresBackend(dsn, coordination=second, **QUICK)
            await b.open("b")
            try:
                with pytest.raises(MixedModesError, match=rf"b \({second}\)"):
                    await claim(a, "report", 1, lock=True)
                assert a.refusal is not None  # and /readyz says so
                assert "b (" in a.refusal
                with pytest.raises(MixedModesError):
                    await a.record_unclaimed([missed("report", 1)])
                won = await claim(b, "report", 1, lock=True)
                assert won.status == CLAIMED
                await release(b, record(won, "b"), unlock=True)
            finally:
                await b.close()
            assert (await claim(a, "report", 2, lock=True)).status == CLAIMED
            assert a.refusal is None
            assert sql(dsn, "SELECT replica_id FROM replicron_runs ORDER BY run_id") == [
                ("b",),
                ("a",),
            ]

    run(main())


def test_a_lease_replica_is_refused_while_a_frozen_advisory_run_holds_its_lock(dsn: str) -> None:
    """An advisory replica froze mid-run: its heartbeats are stale, but its session lives and
    holds the job's lock. A lease replica, which does not take that lock, may not start in the
    namespace until the lock is gone."""

    async def main() -> None:
        async with opened(dsn, "a", coordination="advisory") as a:
            running = await claim(a, "report", 1, lock=True)
            sql(dsn, "UPDATE replicron_replicas SET last_seen = now() - interval '1 day'")
            sql(dsn, "UPDATE replicron_runs SET heartbeat_at = now() - interval '1 day'")
            with pytest.raises(ConfigurationError, match=r"a \(advisory\)"):
                async with opened(dsn, "b", coordination="lease"):
                    pass
            assert sql(
                dsn,
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE datname = current_database()"
                " AND application_name = 'replicron a'",
            ) == [(True,)]
            async with opened(dsn, "b", coordination="lease") as b:
                assert (await claim(b, "report", 2, lock=True)).status == CLAIMED
            assert row(dsn, running.run_id)[0] is None  # a's to write when it wakes

    run(main())


def test_advisory_only_options_are_refused_in_lease_mode() -> None:
    with pytest.raises(ConfigurationError, match="fence_stale_holders"):
        PostgresBackend("postgresql://", coordination="lease", fence_stale_holders=True)
    with pytest.raises(ConfigurationError, match="session_pooler"):
        PostgresBackend("postgresql://", coordination="lease", session_pooler=True)
    with pytest.raises(ConfigurationError, match="'advisory' or 'lease'"):
        PostgresBackend("postgresql://", coordination="rows")  # type: ignore[arg-type]


def run_ids_drawn(dsn: str) -> int:
    """Run ids drawn from the ledger's sequence so far: one per insert tried, won or not."""
    [(drawn,)] = sql(
        dsn,
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM replicron_runs_run_id_seq",
    )
    return int(drawn)


def test_among_peers_a_claim_is_one_statement_that_tries_no_tick_with_a_row(dsn: str) -> None:
    """A replica that is not a tick's first claims the ticks of an instant in one statement,
    which tries no insert for a tick whose row its first replica already wrote: no separate
    read before it, no run id drawn for a tick that is taken."""

    async def main() -> None:
        async with (
            opened(dsn, "a", coordination="lease") as a,
            opened(dsn, "b", coordination="lease") as b,
        ):
            await a._housekeeper.heartbeat()  # each sees the other
            jobs = [f"job-{n}" for n in range(20)]
            first = await a.claim([ClaimRequest(job, tick(1), False) for job in jobs[:15]])
            assert {c.status for c in first} == {CLAIMED}
            drawn = run_ids_drawn(dsn)
            ran: list[str] = []
            statements = b._statements
            fetch = statements.fetch

            async def counted(name: str, **params: Any) -> list[Any]:
                ran.append(name)
                return await fetch(name, **params)

            statements.fetch = counted  # type: ignore[method-assign]
            answers = await b.claim([ClaimRequest(job, tick(1), False) for job in jobs])
            assert [c.status for c in answers] == [TAKEN] * 15 + [CLAIMED] * 5
            assert ran == ["lease_claim"]
            assert run_ids_drawn(dsn) == drawn + 5  # the 15 taken ticks were not tried
            ran.clear()
            assert {c.status for c in await b.claim([ClaimRequest(jobs[0], tick(1), False)])} == {
                TAKEN
            }
            assert ran == ["lease_claim"]
            assert run_ids_drawn(dsn) == drawn + 5

    run(main())


def test_on_the_applications_pool_no_connection_is_kept(dsn: str) -> None:
    """Given the application's pool, lease mode borrows a connection per statement: the pool's
    connections are all the replica uses, and each goes back idle."""

    async def main() -> None:
        async with AsyncConnectionPool(
            dsn, min_size=1, max_size=1, open=False, kwargs={"prepare_threshold": 0}
        ) as pool:  # one connection, which would prepare every statement it is given
            backend = PostgresBackend(pool, heartbeat_interval=3600, coordination="lease")
            await backend.open("a")
            try:
                won = await claim(backend, "report", 1, lock=True)
                await backend._housekeeper.heartbeat()
                await release(backend, record(won, "a"), unlock=True)
                assert row(dsn, won.run_id)[0] == "succeeded"
                assert backend.connected
                async with pool.connection() as conn:  # a pooler may lose prepared ones
                    cursor = await conn.execute(
                        "SELECT count(*) FROM pg_prepared_statements", prepare=False
                    )
                    assert await cursor.fetchone() == (0,)
                assert pool.get_stats()["pool_size"] == 1
                assert pool.get_stats()["pool_available"] == pool.get_stats()["pool_size"]
                assert sql(
                    dsn,
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE 'replicron%%'",
                ) == [(0,)]
            finally:
                await backend.close()

    run(main())


def test_on_the_applications_pool_a_connection_the_server_ended_loses_no_outcome(
    dsn: str,
) -> None:
    """The pool hands out a connection whose server session was ended (a restart, an idle
    timeout, an operator): the outcome's write fails at its BEGIN, is retried on a new
    connection, and lands."""

    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            backend = PostgresBackend(pool, heartbeat_interval=3600, coordination="lease")
            await backend.open("a")
            try:
                won = await claim(backend, "report", 1, lock=True)
                async with pool.connection() as conn:
                    pid = conn.info.backend_pid
                assert sql(dsn, "SELECT pg_terminate_backend(%s, 5000)", [pid]) == [(True,)]
                await release(backend, record(won, "a"), unlock=True)
                assert row(dsn, won.run_id) == ("succeeded", 0, False)
                assert lock_row(dsn, "report") == (None, None, 1)
                async with pool.connection() as conn:
                    assert conn.info.backend_pid != pid
            finally:
                await backend.close()

    run(main())


def test_on_the_applications_pool_a_lease_counts_from_its_transactions_begin(dsn: str) -> None:
    """The server counts a lease from its transaction's start (``now()``), which on a borrowed
    connection is the BEGIN before the statement: the replica must count its lease from no
    later than that, or it would stop its run after another replica may have taken it."""

    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            backend = PostgresBackend(pool, heartbeat_interval=3600, coordination="lease")
            await backend.open("a")
            try:
                session = backend._statements.session
                assert session is not None
                for _ in range(20):
                    [(began, _)] = await session.fetch("SELECT now(), %(pid)s::int", {})
                    assert session.last_round_trip is not None
                    assert session.last_round_trip.sent_wall <= began.timestamp()
            finally:
                await backend.close()

    run(main())
