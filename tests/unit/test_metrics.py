"""ReplicronCollector: a scheduler's runs, errors and cluster view as Prometheus metrics,
scraped from a registry of the test's own while a fake clock drives the scheduler."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from replicron import (
    AsyncScheduler,
    ConfigurationError,
    MemoryBackend,
    MemoryState,
    Outcome,
    RunEvent,
    Scheduler,
    every,
)
from replicron.backends import Backend, Claim, ClaimRequest, Release, RunRecord
from replicron.cluster import ClusterStatus, JobView
from replicron.metrics import ReplicronCollector
from replicron.testing import FakeClock
from tests.helpers import FlakyBackend, z

# Far ahead of the wall clock, which the in-process backend reads the cluster by: no tick of
# these tests is ever overdue by it.
START = z(2100, 1, 1)
T = [START + timedelta(seconds=10 * k) for k in range(10)]  # ticks of every(10 s)
#: Longer than any test: for the tests that need no cluster read.
HOURLY = 3600.0
#: For the tests that wait for the cluster's view of what they did.
OFTEN = 0.1


def succeed() -> None:
    pass


def fail() -> None:
    raise RuntimeError("the job failed")


class StatusWaiter:
    """A ``watch_cluster`` callback that lets a test wait for a read without sleeping.
    Subscribed after the collector, it hears of each read after the collector did."""

    def __init__(self) -> None:
        self.statuses: list[ClusterStatus | None] = []
        self._cond = threading.Condition()

    def __call__(self, status: ClusterStatus | None) -> None:
        with self._cond:
            self.statuses.append(status)
            self._cond.notify_all()

    def wait_for(self, check: Callable[[ClusterStatus | None], bool]) -> ClusterStatus | None:
        """The first read from now on that passes ``check``."""
        with self._cond:
            return self._wait(check, len(self.statuses))

    def _wait(
        self, check: Callable[[ClusterStatus | None], bool], seen: int
    ) -> ClusterStatus | None:
        with self._cond:

            def arrived() -> bool:
                return any(check(s) for s in self.statuses[seen:])

            assert self._cond.wait_for(arrived, 10), f"no such read; got {self.statuses[seen:]}"
            return next(s for s in self.statuses[seen:] if check(s))


class NoRegistryBackend:
    """A backend that coordinates runs but keeps no registry of the cluster's jobs, as a
    third-party one may: no cluster read ever comes, so a test hands the collector its own."""

    def __init__(self) -> None:
        self._ledger = MemoryBackend()

    def register_job(self, name: str) -> None:
        self._ledger.register_job(name)

    def unregister_job(self, name: str) -> None:
        self._ledger.unregister_job(name)

    async def open(
        self, replica_id: str, on_lock_lost: Callable[[Sequence[int]], None] | None = None
    ) -> None:
        await self._ledger.open(replica_id, on_lock_lost)

    async def close(self) -> None:
        await self._ledger.close()

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        return await self._ledger.claim(requests)

    async def lock(self, claim: Claim) -> bool:
        return await self._ledger.lock(claim)

    async def release(self, releases: Sequence[Release]) -> None:
        await self._ledger.release(releases)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        return await self._ledger.record_unclaimed(records)

    async def last_ticks(self, jobs: Sequence[str]) -> dict[str, datetime]:
        return await self._ledger.last_ticks(jobs)

    def clock_offset(self) -> timedelta | None:
        return None


class SkewedBackend(MemoryBackend):
    """The in-process backend as if its coordinator's clock were ahead of this process's."""

    def clock_offset(self) -> timedelta | None:
        return timedelta(milliseconds=250)


class FailedOverBackend(MemoryBackend):
    """The in-process backend as if its server had changed under it twice (failovers)."""

    server_changes = 2


class Setup:
    """A running scheduler on a fake clock, its collector, and a registry with only it."""

    def __init__(self, backend: Backend | None = None, cluster_every: float = HOURLY) -> None:
        self.clock = FakeClock(START)
        self.scheduler = Scheduler(
            clock=self.clock, backend=backend or MemoryBackend(), replica_id="r1"
        )
        self.scheduler.add_job(every(seconds=10), succeed, name="ok")
        self.scheduler.add_job(every(seconds=10), fail, name="broken")
        self.scheduler.start()
        self.collector = ReplicronCollector(self.scheduler, cluster_every=cluster_every)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self.reads = StatusWaiter()
        self.scheduler.watch_cluster(self.reads, every=cluster_every)

    def tick(self, to: datetime) -> None:
        self.clock.set(to)
        self.scheduler.wait_idle()

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def runs(self, job: str, outcome: Outcome) -> float | None:
        return self.value("replicron_job_runs_total", job=job, outcome=outcome.value)

    def close(self) -> None:
        self.scheduler.shutdown(timeout=5)
        self.collector.close()


@pytest.fixture
def setup() -> Iterator[Setup]:
    made = Setup()
    yield made
    made.close()


@pytest.fixture
def unread() -> Iterator[Setup]:
    """A setup whose backend has no cluster view: the test hands the collector statuses."""
    made = Setup(NoRegistryBackend())
    yield made
    made.close()


@pytest.fixture
def live() -> Iterator[Setup]:
    """A setup whose cluster view is read every OFTEN seconds."""
    made = Setup(cluster_every=OFTEN)
    yield made
    made.close()


def test_runs_are_counted_by_job_and_outcome(setup: Setup) -> None:
    assert setup.runs("ok", Outcome.SUCCEEDED) == 0  # every series starts at 0
    for tick in T[1:4]:
        setup.tick(tick)
    assert setup.runs("ok", Outcome.SUCCEEDED) == 3
    assert setup.runs("broken", Outcome.FAILED) == 3
    for outcome in Outcome:
        if outcome is not Outcome.SUCCEEDED:
            assert setup.runs("ok", outcome) == 0, outcome
        if outcome is not Outcome.FAILED:
            assert setup.runs("broken", outcome) == 0, outcome
    for job in ("ok", "broken"):
        assert setup.value("replicron_job_duration_seconds_count", job=job) == 3
        assert setup.value("replicron_job_lateness_seconds_count", job=job) == 3
    assert setup.value("replicron_lock_errors_total") == 0
    assert setup.value("replicron_up") == 1


def test_lateness_is_how_long_after_its_tick_a_run_started(setup: Setup) -> None:
    setup.tick(T[1] + timedelta(seconds=3))

    def lateness(le: str) -> float | None:
        return setup.value("replicron_job_lateness_seconds_bucket", job="ok", le=le)

    assert (lateness("2.5"), lateness("5.0"), lateness("+Inf")) == (0, 1, 1)
    assert setup.value("replicron_job_lateness_seconds_sum", job="ok") == 3.0


def test_a_manual_run_is_counted_but_has_no_lateness(setup: Setup) -> None:
    setup.scheduler.get_job("ok").run_now()
    setup.scheduler.wait_idle()
    assert setup.runs("ok", Outcome.SUCCEEDED) == 1
    assert setup.value("replicron_job_duration_seconds_count", job="ok") == 1
    assert setup.value("replicron_job_lateness_seconds_count", job="ok") == 0


def test_durations_fall_into_their_buckets() -> None:
    clock = FakeClock(START)

    def takes_two_seconds() -> None:
        clock.advance(timedelta(seconds=2))

    with Scheduler(clock=clock, replica_id="r1") as scheduler:
        scheduler.add_job(every(minutes=1), takes_two_seconds, name="slow")
        collector = ReplicronCollector(scheduler, cluster_every=HOURLY)
        registry = CollectorRegistry()
        registry.register(collector)
        clock.set(START + timedelta(minutes=1))
        scheduler.wait_idle()

        def duration(le: str) -> float | None:
            return registry.get_sample_value(
                "replicron_job_duration_seconds_bucket", {"job": "slow", "le": le}
            )

        assert (duration("1.0"), duration("2.5"), duration("+Inf")) == (0, 1, 1)
        assert registry.get_sample_value("replicron_job_duration_seconds_sum", {"job": "slow"}) == 2
        collector.close()


def test_a_paused_job_counts_its_ticks_as_paused_not_skipped(setup: Setup) -> None:
    assert setup.scheduler.pause_job("ok")
    setup.tick(T[1])
    assert setup.runs("ok", Outcome.PAUSED) == 1
    assert setup.runs("ok", Outcome.SKIPPED_OVERLAP) == 0
    assert setup.runs("ok", Outcome.SUCCEEDED) == 0
    assert setup.value("replicron_job_duration_seconds_count", job="ok") == 0


#: The listener hook that reports each outcome (see ``Listener``).
HOOK = {
    Outcome.SUCCEEDED: "after_success",
    Outcome.FAILED: "after_failure",
    Outcome.TIMED_OUT: "on_timeout",
    Outcome.SKIPPED_OVERLAP: "on_skipped",
    Outcome.SKIPPED_LIMIT: "on_skipped",
    Outcome.PAUSED: "on_skipped",
    Outcome.MISSED: "on_missed",
    Outcome.ABANDONED: "on_abandoned",
}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_each_outcome_is_counted_as_its_hook_reports_it(setup: Setup, outcome: Outcome) -> None:
    """Whichever hook the scheduler calls, the event's outcome is what is counted; only a
    run that ended has a duration, only a run a lateness."""
    started = T[1] + timedelta(seconds=2) if outcome.ran else None
    finished = started and started + timedelta(seconds=1)
    event = RunEvent("ok", T[1], "r1", 1, outcome, started, finished)
    getattr(setup.collector._hooks, HOOK[outcome])(event)
    assert [o for o in Outcome if setup.runs("ok", o)] == [outcome]
    ran = 1 if outcome.ran else 0
    assert setup.value("replicron_job_duration_seconds_count", job="ok") == ran
    assert setup.value("replicron_job_lateness_seconds_count", job="ok") == ran


def test_backend_failures_are_counted_as_lock_errors() -> None:
    backend = FlakyBackend(fail_claims=0, fail_records=0)
    setup = Setup(backend)
    try:
        backend.fail_claims = 2  # each claim holds both jobs' ticks
        setup.tick(T[1])
        setup.tick(T[1] + timedelta(seconds=1))  # tried again each second
        assert setup.value("replicron_lock_errors_total") == 4
        setup.tick(T[1] + timedelta(seconds=2))
        assert setup.runs("ok", Outcome.SUCCEEDED) == 1
        assert setup.value("replicron_lock_errors_total") == 4
    finally:
        setup.close()


def test_up_follows_the_scheduler_and_its_cluster_reads() -> None:
    backend = FlakyBackend(fail_claims=0, fail_records=0)
    clock = FakeClock(START)
    scheduler = Scheduler(clock=clock, backend=backend, replica_id="r1")
    scheduler.add_job(every(seconds=10), succeed, name="ok")
    collector = ReplicronCollector(scheduler, cluster_every=0.05)
    registry = CollectorRegistry()
    registry.register(collector)
    reads = StatusWaiter()
    scheduler.watch_cluster(reads, every=0.05)
    assert registry.get_sample_value("replicron_up") == 0  # not started
    scheduler.start()
    try:
        assert registry.get_sample_value("replicron_up") == 1  # started; no read failed yet
        backend.reads_fail = True
        reads.wait_for(lambda status: status is None)
        assert registry.get_sample_value("replicron_up") == 0
        backend.reads_fail = False
        reads.wait_for(lambda status: status is not None)
        assert registry.get_sample_value("replicron_up") == 1
    finally:
        scheduler.shutdown(timeout=5)
    assert registry.get_sample_value("replicron_up") == 0
    collector.close()


def test_the_cluster_gauges_come_from_the_cluster_read(live: Setup) -> None:
    setup = live
    setup.tick(T[1])
    setup.reads.wait_for(lambda s: s is not None and _view(s, "ok").last_success_at is not None)
    # The in-process ledger has the success the fake clock stamped.
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="ok") == (
        T[1].timestamp()
    )
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="broken") is None
    assert setup.value("replicron_job_overdue", job="ok") == 0
    assert setup.value("replicron_job_overdue", job="broken") == 0


def test_a_removed_job_leaves_no_series(live: Setup) -> None:
    setup = live
    setup.tick(T[1])
    setup.scheduler.remove_job("broken")
    assert setup.runs("broken", Outcome.FAILED) is None
    assert setup.value("replicron_job_duration_seconds_count", job="broken") is None
    # The ledger keeps the job's runs, but no replica schedules it any more.
    setup.reads.wait_for(lambda s: s is not None and not _view(s, "broken").scheduled_by)
    assert setup.value("replicron_job_overdue", job="broken") is None
    assert setup.value("replicron_job_overdue", job="ok") == 0
    assert "broken" not in generate_latest(setup.registry).decode()
    # Added again: a new series, from 0.
    setup.scheduler.add_job(every(seconds=10), fail, name="broken")
    assert setup.runs("broken", Outcome.FAILED) == 0


def test_the_cluster_gauges_cover_every_registered_job(unread: Setup) -> None:
    setup = unread
    assert setup.value("replicron_up") == 1  # no read has failed
    assert setup.value("replicron_job_overdue", job="ok") is None  # nothing read yet
    success = START - timedelta(minutes=5)
    status = ClusterStatus(
        "ns",
        START,
        (
            _hand_view("ok", last_success_at=success),
            _hand_view("elsewhere", scheduled_by=("r2",), overdue_since=START),
            _hand_view("long_gone", last_success_at=success, overdue_since=START),
            _hand_view("forgotten", last_success_at=success, registered=False),
        ),
        (),
    )
    setup.collector._cluster_read(status)
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="ok") == (
        success.timestamp()
    )
    assert setup.value("replicron_job_overdue", job="ok") == 0
    # Scheduled by another replica only: reported here too, so every replica says the same.
    assert setup.value("replicron_job_overdue", job="elsewhere") == 1
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="elsewhere") is None
    # Registered by replicas that are gone (dropped from the code, say): overdue here too.
    assert setup.value("replicron_job_overdue", job="long_gone") == 1
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="long_gone") == (
        success.timestamp()
    )
    # Forgotten: history, with no series.
    assert setup.value("replicron_job_overdue", job="forgotten") is None
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="forgotten") is None
    # Our own job "broken", absent from this read, has no cluster series.
    assert setup.value("replicron_job_overdue", job="broken") is None

    setup.collector._cluster_read(None)  # a failed read: the last good one stands, up is 0
    assert setup.value("replicron_up") == 0
    assert setup.value("replicron_job_overdue", job="elsewhere") == 1
    later = ClusterStatus("ns", START, (_hand_view("elsewhere", scheduled_by=("r2",)),), ())
    setup.collector._cluster_read(later)
    assert setup.value("replicron_up") == 1
    assert setup.value("replicron_job_overdue", job="elsewhere") == 0
    assert setup.value("replicron_job_overdue", job="ok") is None


def test_a_stopped_scheduler_reports_no_cluster_view(live: Setup) -> None:
    setup = live
    setup.tick(T[1])
    setup.reads.wait_for(lambda s: s is not None and _view(s, "ok").last_success_at is not None)
    assert setup.value("replicron_job_overdue", job="ok") == 0
    setup.scheduler.shutdown(timeout=5)
    assert setup.value("replicron_up") == 0
    assert setup.value("replicron_job_overdue", job="ok") is None
    assert setup.value("replicron_job_last_success_timestamp_seconds", job="ok") is None
    assert setup.runs("ok", Outcome.SUCCEEDED) == 1  # what this replica did stays


def test_clock_offset_is_reported_only_where_the_coordinator_has_a_clock() -> None:
    setup = Setup()
    try:
        assert setup.value("replicron_clock_offset_seconds") is None
    finally:
        setup.close()
    skewed = Setup(SkewedBackend())
    try:
        assert skewed.value("replicron_clock_offset_seconds") == 0.25
    finally:
        skewed.close()


def test_server_changes_are_reported_only_where_the_backend_counts_them() -> None:
    setup = Setup()
    try:
        assert setup.value("replicron_server_changes_total") is None
    finally:
        setup.close()
    failed_over = Setup(FailedOverBackend())
    try:
        assert failed_over.value("replicron_server_changes_total") == 2
    finally:
        failed_over.close()


def test_close_stops_counting(setup: Setup) -> None:
    setup.tick(T[1])
    setup.collector.close()
    setup.collector.close()  # idempotent
    setup.tick(T[2])
    assert setup.runs("ok", Outcome.SUCCEEDED) == 1


def test_a_collector_is_registered_once_per_registry(setup: Setup) -> None:
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        setup.registry.register(ReplicronCollector(setup.scheduler, cluster_every=HOURLY))


@pytest.mark.parametrize(
    "options",
    [
        {"cluster_every": 0},
        {"cluster_every": float("nan")},
        {"duration_buckets": (1.0, 0.5)},
        {"lateness_buckets": ()},
        {"lateness_buckets": (1.0, float("inf"))},
    ],
)
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    scheduler = Scheduler()
    with pytest.raises(ConfigurationError):
        ReplicronCollector(scheduler, **options)  # type: ignore[arg-type]


def test_an_async_scheduler_is_measured_the_same_way() -> None:
    async def main() -> CollectorRegistry:
        clock = FakeClock(START)
        registry = CollectorRegistry()
        async with AsyncScheduler(clock=clock, replica_id="r1") as scheduler:
            scheduler.add_job(every(seconds=10), succeed, name="ok")
            collector = ReplicronCollector(scheduler, cluster_every=HOURLY)
            registry.register(collector)
            for tick in T[1:3]:
                clock.set(tick)
                await asyncio.wait_for(scheduler.wait_idle(), 10)
            assert registry.get_sample_value("replicron_up") == 1
            collector.close()
        return registry

    registry = asyncio.run(main())
    labels = {"job": "ok", "outcome": "succeeded"}
    assert registry.get_sample_value("replicron_job_runs_total", labels) == 2
    assert registry.get_sample_value("replicron_up") == 0


def _view(status: ClusterStatus | None, job: str) -> JobView:
    assert status is not None
    view = status.job(job)
    assert view is not None, status
    return view


def _hand_view(
    job: str,
    *,
    scheduled_by: tuple[str, ...] = (),
    last_success_at: datetime | None = None,
    overdue_since: datetime | None = None,
    registered: bool = True,
) -> JobView:
    return JobView(
        job=job,
        trigger=None,
        last_scheduled_at=None,
        last_outcome=None,
        last_replica=None,
        last_started_at=None,
        last_finished_at=None,
        last_error=None,
        last_success_at=last_success_at,
        running=(),
        blocked_by=(),
        next_due=None,
        overdue_since=overdue_since,
        paused=None,
        drift=(),
        missed=0,
        scheduled_by=scheduled_by,
        registered=registered,
    )


def test_leader_is_1_on_the_leader_alone() -> None:
    state = MemoryState()
    clock = FakeClock(START)
    schedulers = [
        Scheduler(clock=clock, backend=MemoryBackend(state), replica_id=f"r{n}", leader=True)
        for n in range(2)
    ]
    plain = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="plain")
    registries = []
    for scheduler in [*schedulers, plain]:
        registry = CollectorRegistry()
        registry.register(ReplicronCollector(scheduler))
        registries.append(registry)
    assert [r.get_sample_value("replicron_leader") for r in registries] == [0, 0, 0]
    for scheduler in [*schedulers, plain]:
        scheduler.start()
        scheduler.wait_idle()
    try:
        assert [r.get_sample_value("replicron_leader") for r in registries] == [1, 0, 0]
        schedulers[0].shutdown(timeout=5)
        schedulers[1].wait_idle()
        assert [r.get_sample_value("replicron_leader") for r in registries] == [0, 1, 0]
    finally:
        for scheduler in [*schedulers, plain]:
            scheduler.shutdown(timeout=5)
