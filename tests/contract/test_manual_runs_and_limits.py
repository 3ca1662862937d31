"""The backend contract for manual runs (``ClaimRequest.manual``) and limited runs
(``ClaimRequest.max_runs``), checked against every backend.

Ticks are minutes of 2024-01-01 UTC (see ``test_backend_contract``); a manual run is claimed at
an instant off the minutes, as the engine picks it.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from replicron.backends.base import Backend, Claim, ClaimRequest, ClaimStatus, Release, RunRecord
from replicron.events import Outcome
from tests.contract.conftest import Backends, Recorded
from tests.contract.test_backend_contract import T0, last_tick, record, release, skip, tick

CLAIMED, TAKEN, LOCKED = ClaimStatus.CLAIMED, ClaimStatus.TAKEN, ClaimStatus.LOCKED
EXHAUSTED = ClaimStatus.EXHAUSTED


def asked(n: int) -> datetime:
    """A manual run asked for half a minute after the n-th tick."""
    return tick(n) + timedelta(seconds=30)


async def manual(handle: Backend, job: str, at: datetime, *, lock: bool = True) -> Claim:
    [result] = await handle.claim([ClaimRequest(job, at, lock, manual=True)])
    assert (result.job, result.scheduled_at, result.manual) == (job, at, True)
    return result


def missed(job: str, n: int, max_runs: int | None, why: str = "no replica ran it") -> RunRecord:
    """Tick ``n`` of ``job`` as a replica that could not run it records it."""
    return RunRecord(
        job, tick(n), Outcome.MISSED, "replica-1", None, None, None, why, False, max_runs
    )


async def limited(handle: Backend, job: str, n: int, max_runs: int, *, lock: bool = True) -> Claim:
    [result] = await handle.claim([ClaimRequest(job, tick(n), lock, max_runs=max_runs)])
    assert (result.job, result.scheduled_at, result.manual) == (job, tick(n), False)
    return result


async def succeed(backends: Backends, handle: Backend, claimed: Claim) -> None:
    await release(handle, record(backends, handle, claimed), unlock=claimed.locked)


def manual_record(backends: Backends, handle: Backend, claimed: Claim) -> RunRecord:
    return record(backends, handle, claimed)._replace(manual=True)


# ---- manual runs ------------------------------------------------------------------------


@pytest.mark.parametrize("lock", [False, True])
def test_a_manual_run_is_claimed_and_recorded_as_manual(backends: Backends, lock: bool) -> None:
    async def main() -> None:
        a, b = await backends.open(2)
        won = await manual(a, "report", asked(1), lock=lock)
        assert (won.status, won.locked) == (CLAIMED, lock)
        assert isinstance(won.run_id, int)
        # The same instant asked for again (another replica, the same microsecond): taken.
        assert (await manual(b, "report", asked(1))).status is TAKEN
        await release(a, manual_record(backends, a, won), unlock=lock)
        assert backends.recorded("report") == {
            asked(1): Recorded("succeeded", "replica-0", None, manual=True)
        }

    backends.run(main())


def test_a_manual_run_is_never_refused_as_not_yet_due(backends: Backends) -> None:
    async def main() -> None:
        [a] = await backends.open(1)
        # Far ahead of every clock: a tick would be EARLY on a backend with a clock of its own.
        future = datetime.now(T0.tzinfo) + timedelta(days=365)
        assert (await manual(a, "report", future)).status is CLAIMED

    backends.run(main())


def test_manual_runs_are_not_ticks_for_catch_up(backends: Backends) -> None:
    async def main() -> None:
        [a] = await backends.open(1)
        await succeed(backends, a, await limited(a, "report", 1, 10))
        run = await manual(a, "report", asked(5))
        await release(a, manual_record(backends, a, run), unlock=True)
        assert await last_tick(a, "report") == tick(1)
        assert await last_tick(a, "only-manual") is None
        await manual(a, "only-manual", asked(2))
        assert await last_tick(a, "only-manual") is None

    backends.run(main())


def test_a_manual_run_keeps_out_of_a_run_going_elsewhere(backends: Backends) -> None:
    async def main() -> None:
        a, b = await backends.open(2)
        running = await limited(a, "report", 1, 10)
        assert running.locked
        blocked = await manual(b, "report", asked(1))
        assert blocked.status is LOCKED
        await release(
            b,
            record(backends, b, blocked, Outcome.SKIPPED_OVERLAP)._replace(manual=True),
            unlock=False,
        )
        await succeed(backends, a, running)
        assert backends.recorded("report")[asked(1)] == Recorded(
            "skipped_overlap", "replica-1", None, manual=True
        )
        # And a scheduled tick keeps out of a manual run going.
        going = await manual(a, "report", asked(2))
        assert going.locked
        await skip(backends, b, await limited(b, "report", 3, 10))
        await release(a, manual_record(backends, a, going), unlock=True)

    backends.run(main())


# ---- limited runs -----------------------------------------------------------------------


def test_max_runs_counts_the_runs_of_every_handle(backends: Backends) -> None:
    async def main() -> None:
        a, b, c = await backends.open(3)
        await succeed(backends, a, await limited(a, "report", 1, 2))
        second = await limited(b, "report", 2, 2)
        assert second.status is CLAIMED
        # The second run is still going: it counts.
        for handle in (a, b, c):
            assert (await limited(handle, "report", 3, 2)).status is EXHAUSTED
        await release(b, record(backends, b, second, Outcome.FAILED, "boom"), unlock=True)
        assert (await limited(c, "report", 4, 2)).status is EXHAUSTED
        # Nothing is recorded for a tick past the limit: the job has no more ticks.
        assert sorted(backends.recorded("report")) == [tick(1), tick(2)]
        assert await last_tick(c, "report") == tick(2)
        # A higher limit lets the job go on; other jobs and manual runs were never limited.
        assert (await limited(c, "report", 5, 3)).status is CLAIMED
        assert (await limited(c, "sync", 5, 2)).status is CLAIMED
        assert (await manual(a, "report", asked(9), lock=False)).status is CLAIMED

    backends.run(main())


def test_concurrent_claims_of_different_ticks_of_a_limited_job_start_at_most_max_runs(
    backends: Backends,
) -> None:
    async def main() -> None:
        handles = await backends.open(4)
        for round_ in range(10):
            job = f"once-{round_}"
            claims = await asyncio.gather(
                *(limited(handle, job, n, 1, lock=False) for n, handle in enumerate(handles))
            )
            statuses = sorted(c.status.value for c in claims)
            assert statuses == ["claimed"] + ["exhausted"] * 3, job

    backends.run(main())


@pytest.mark.parametrize(
    "outcome", [Outcome.MISSED, Outcome.SKIPPED_OVERLAP, Outcome.SKIPPED_LIMIT]
)
def test_a_claimed_tick_that_did_not_run_does_not_count(
    backends: Backends, outcome: Outcome
) -> None:
    async def main() -> None:
        a, b = await backends.open(2)
        not_run = await limited(a, "report", 1, 1, lock=False)
        await release(a, record(backends, a, not_run, outcome), unlock=False)
        assert await b.record_unclaimed(
            [RunRecord("report", tick(2), Outcome.MISSED, "replica-1", None, None, None, None)]
        ) == [True]
        assert (await limited(b, "report", 3, 1)).status is CLAIMED
        assert (await limited(a, "report", 4, 1)).status is EXHAUSTED

    backends.run(main())


def test_a_tick_refused_the_lock_and_not_yet_recorded_does_not_count(backends: Backends) -> None:
    # Between a refused claim and its claimant recording it skipped, another replica's claim
    # counts one run of a max_runs=2 job (the running one), not two: it is not retired early.
    async def main() -> None:
        a, b, c = await backends.open(3)
        running = await limited(a, "report", 1, 2)
        assert (running.status, running.locked) == (CLAIMED, True)
        refused = await limited(b, "report", 2, 2)
        assert refused.status is LOCKED  # b has not recorded it yet
        also_refused = await limited(c, "report", 3, 2)
        assert also_refused.status is LOCKED  # not EXHAUSTED
        await skip(backends, b, refused)
        await skip(backends, c, also_refused)
        await succeed(backends, a, running)
        second = await limited(c, "report", 4, 2)
        assert (second.status, second.locked) == (CLAIMED, True)
        await succeed(backends, c, second)
        assert (await limited(b, "report", 5, 2)).status is EXHAUSTED

    backends.run(main())


def test_ticks_of_a_job_past_its_max_runs_are_not_recorded_missed(backends: Backends) -> None:
    # Catch-up on another replica after the job ran its max_runs: those ticks are not ticks
    # of the job any more, and a record of them as missed would be a false alarm.
    async def main() -> None:
        a, b = await backends.open(2)

        assert await b.record_unclaimed([missed("report", 1, 2)]) == [True]  # not reached
        await succeed(backends, a, await limited(a, "report", 2, 2))
        await succeed(backends, a, await limited(a, "report", 3, 2))
        assert await b.record_unclaimed(
            [missed("report", 4, 2), missed("report", 5, 2), missed("other", 4, None)]
        ) == [False, False, True]
        assert sorted(backends.recorded("report")) == [tick(1), tick(2), tick(3)]

    backends.run(main())


def test_ticks_missed_before_the_run_that_reached_max_runs_are_recorded(
    backends: Backends,
) -> None:
    # An outage: the ticks that fell due meanwhile are recorded after the current one is
    # claimed. When that claim started the job's last run, the ticks before it were still
    # ticks of the job, and each must get its record; those after it are not ticks.
    async def main() -> None:
        a, b = await backends.open(2)

        await succeed(backends, a, await limited(a, "report", 1, 2))
        await succeed(backends, a, await limited(a, "report", 4, 2))  # the last run
        ticks = [missed("report", n, 2, "the backend was unreachable") for n in (2, 3, 5)]
        assert await b.record_unclaimed(ticks) == [
            True,
            True,
            False,
        ]
        assert sorted(backends.recorded("report")) == [tick(n) for n in range(1, 5)]

    backends.run(main())


def test_abandoned_runs_count(backends: Backends) -> None:
    async def main() -> None:
        a, b = await backends.open(2)
        lost = await limited(a, "report", 1, 1)
        await a.release([Release(record(backends, a, lost, Outcome.ABANDONED), True)])
        assert (await limited(b, "report", 2, 1)).status is EXHAUSTED

    backends.run(main())


def test_manual_runs_do_not_count_against_max_runs(backends: Backends) -> None:
    async def main() -> None:
        a, b = await backends.open(2)
        for n in range(3):
            run = await manual(a, "report", asked(n), lock=False)
            await release(a, manual_record(backends, a, run), unlock=False)
        assert (await limited(b, "report", 4, 1)).status is CLAIMED

    backends.run(main())


def test_one_batch_mixes_limited_manual_and_plain_requests(backends: Backends) -> None:
    async def main() -> None:
        a, b = await backends.open(2)
        await succeed(backends, a, await limited(a, "report", 1, 1))
        answers = await b.claim(
            [
                ClaimRequest("report", tick(2), True, max_runs=1),
                ClaimRequest("report", asked(2), True, manual=True),
                ClaimRequest("sync", tick(2), False),
                ClaimRequest("sync", asked(2), False, manual=True),
            ]
        )
        assert [(c.status, c.manual) for c in answers] == [
            (EXHAUSTED, False),
            (CLAIMED, True),
            (CLAIMED, False),
            (CLAIMED, True),
        ]
        assert answers[0].run_id is None
        assert answers[1].locked

    backends.run(main())
