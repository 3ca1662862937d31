"""Prometheus metrics of a scheduler, for services that already serve ``/metrics``.

Needs the ``metrics`` extra (``pip install replicron[metrics]``)::

    from prometheus_client import REGISTRY
    from replicron.metrics import ReplicronCollector

    collector = ReplicronCollector(scheduler)
    REGISTRY.register(collector)
    ...
    REGISTRY.unregister(collector)
    collector.close()

Two kinds of series come out of one collector:

* **This replica's**, counted by a listener the collector adds to the scheduler: runs by
  outcome, run durations, lateness, backend errors, the clock offset and ``replicron_up``.
  Sum them over replicas.
* **The cluster's**, read from the shared ledger in the background every ``cluster_every``
  seconds (never on a scrape): each job's last success and whether it is overdue. Every
  replica reports the same values, so take ``max by (job)``.

Series, and when they are left out:

``replicron_job_runs_total{job,outcome}``
    Ticks this replica handled, by :class:`~replicron.Outcome`; every outcome of every job of
    the scheduler starts at 0.
``replicron_job_duration_seconds{job}``
    How long runs that ended took (succeeded, failed, abandoned). A timed-out run is counted
    in ``runs_total`` only: it is reported at its deadline, before it ends.
``replicron_job_lateness_seconds{job}``
    How long after its tick a scheduled run started (manual runs are not ticks and are left
    out; a run started early counts as 0). Observed when the run's outcome is known.
``replicron_lock_errors_total``
    Times the backend failed to claim, lock or record a tick, or a run lost its lock.
``replicron_clock_offset_seconds``
    How far the coordinator's clock is ahead of this process's. Left out where the
    coordinator has no clock of its own (memory, embedded) or before it is measured: 0 would
    claim a measured agreement.
``replicron_server_changes_total``
    Times the database server changed under this replica (a failover to a promoted standby,
    or another cluster behind the same address): each is also logged at ERROR. Left out
    where the backend cannot tell (memory, embedded).
``replicron_up``
    1 while the scheduler runs and its cluster reads succeed: the latest one did, and one
    came within the last ``3 * cluster_every`` seconds (at least 15, real time); else 0.
    After a start it is 1 for that long before the first read. With a backend that keeps no
    cluster view (a third-party one, say) it is 0 once that time has passed.
``replicron_leader``
    Leader mode: 1 while this replica is the leader (it claims the leader-mode jobs' ticks),
    else 0 (also without leader-mode jobs). Summed over the replicas of a deployment in leader
    mode it is 1; 0 for longer than ``stale_after`` means nobody leads.
``replicron_job_last_success_timestamp_seconds{job}``
    When the job's latest successful run in the cluster finished (Unix time); left out for a
    job that never succeeded.
``replicron_job_overdue{job}``
    1 when a tick some replica expected has no row though its grace has passed, else 0.

The cluster series cover the jobs this scheduler has and every job of the cluster's job
registry, as ``replicron status`` reads it: a job dropped from every replica's code while
its registrations stay (its replicas restarted without it, or died) goes overdue here as it
does in ``replicron status --check``, on every replica still up. Its series go once the job
is forgotten (``replicron forget``, or its registrations pruned after the backend's
``retention``); with every replica gone, nobody reports (alert on absence). This replica's
series of a removed job go at the next scrape. The cluster series are left out while the
scheduler is stopped and once the latest good read is stale: a replica that cannot read the
cluster says nothing about it rather than something old (a single failed read leaves them as
they were, and ``replicron_up`` at 0).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from .backends.base import ServerChanges
from .cluster import ClusterStatus
from .errors import ConfigurationError
from .events import Listener, Outcome, RunEvent
from .notify import Notifier
from .scheduler import AsyncScheduler, Scheduler

__all__ = ["DURATION_BUCKETS", "LATENESS_BUCKETS", "NotifierCollector", "ReplicronCollector"]

#: Run durations, from quick HTTP pings to nightly batches.
DURATION_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
)
#: Lateness: a healthy scheduler starts runs within milliseconds; the long tail is runs
#: queued for a worker thread or a job's lock, and catch-up after an outage.
LATENESS_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    14400.0,
)
#: Reads missed before the cluster view counts as stale, and the least time that takes: a
#: read of a busy database may take a while without anything being wrong.
_STALE_AFTER_READS, _STALE_AFTER_MIN = 3, 15.0


class _Histogram:
    """Observations per bucket (not cumulative: one increment per observation)."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, bounds: Sequence[float], value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le).
        self.counts[bisect_left(bounds, value)] += 1
        self.total += value

    def cumulative(self, bounds: Sequence[float]) -> list[tuple[str, float]]:
        labels = [*(repr(bound) for bound in bounds), "+Inf"]
        running, buckets = 0, []
        for label, count in zip(labels, self.counts, strict=True):
            running += count
            buckets.append((label, float(running)))
        return buckets


@dataclass
class _JobRuns:
    """One job's runs on this replica."""

    duration: _Histogram
    lateness: _Histogram
    outcomes: dict[str, int] = field(default_factory=dict)


class _Hooks(Listener):
    """The collector's ears on the scheduler. Hooks run on the scheduler's loop and only take
    the collector's lock for a moment."""

    def __init__(self, collector: ReplicronCollector) -> None:
        self._collector = collector

    def _count_run(self, event: RunEvent) -> None:
        self._collector._count_run(event)

    # Every hook of a tick's outcome: the event says which outcome it was (one hook reports
    # skipped_overlap, skipped_limit and paused).
    after_success = after_failure = on_timeout = _count_run
    on_skipped = on_missed = on_abandoned = _count_run

    def on_lock_error(self, event: RunEvent) -> None:
        self._collector._count_lock_error()

    def on_started(self, replica_id: str) -> None:
        self._collector._scheduler_started()


class ReplicronCollector:
    """A Prometheus collector of ``scheduler``'s metrics (see the module's documentation).

    Creating it adds a listener to the scheduler and subscribes to the cluster's status,
    read every ``cluster_every`` seconds; :meth:`close` undoes both. Register it in any
    ``CollectorRegistry``; scrapes may come from any thread.
    """

    def __init__(
        self,
        scheduler: Scheduler | AsyncScheduler,
        *,
        cluster_every: float = 5.0,
        duration_buckets: Sequence[float] = DURATION_BUCKETS,
        lateness_buckets: Sequence[float] = LATENESS_BUCKETS,
    ) -> None:
        if (
            isinstance(cluster_every, bool)
            or not isinstance(cluster_every, int | float)
            or not math.isfinite(cluster_every)
            or cluster_every <= 0
        ):
            raise ConfigurationError(
                f"cluster_every must be a positive number of seconds, not {cluster_every!r}"
            )
        self._scheduler = scheduler
        self._duration_bounds = _check_buckets("duration_buckets", duration_buckets)
        self._lateness_bounds = _check_buckets("lateness_buckets", lateness_buckets)
        self._stale_after = max(_STALE_AFTER_READS * float(cluster_every), _STALE_AFTER_MIN)
        self._lock = threading.Lock()
        self._runs: dict[str, _JobRuns] = {}
        self._lock_errors = 0
        self._status: ClusterStatus | None = None
        # time.monotonic() of the latest good read, and of the latest word from the watch (or
        # of the start): the reads keep real time whatever the scheduler's clock.
        self._status_at: float | None = None
        self._heard_at: float | None = time.monotonic() if scheduler.running else None
        self._read_failed = False
        self._closed = False
        self._hooks = _Hooks(self)
        scheduler.add_listener(self._hooks)
        self._unwatch: Callable[[], None] = scheduler.watch_cluster(
            self._cluster_read, every=float(cluster_every)
        )

    def close(self) -> None:
        """Stop listening to the scheduler and reading the cluster; idempotent. Unregister
        the collector from its registries as well."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._status = None
        self._unwatch()
        self._scheduler.remove_listener(self._hooks)

    # ---- what the scheduler tells (on its loop) ------------------------------------------

    def _count_run(self, event: RunEvent) -> None:
        outcome = event.outcome
        if outcome is None:  # the scheduler tells every outcome's hook which one it was
            return
        # Only a run has a duration (one that ended) and a lateness.
        duration = event.duration if outcome.ran else None
        lateness = event.lateness if outcome.ran else None
        with self._lock:
            runs = self._runs.get(event.job)
            if runs is None:
                runs = self._runs[event.job] = _JobRuns(
                    _Histogram(len(self._duration_bounds)), _Histogram(len(self._lateness_bounds))
                )
            runs.outcomes[outcome.value] = runs.outcomes.get(outcome.value, 0) + event.ticks
            if duration is not None:
                runs.duration.observe(self._duration_bounds, max(duration.total_seconds(), 0.0))
            if lateness is not None and not event.manual:
                # A replica whose clock runs ahead may start a run a hair before its tick;
                # clamped, so that the histogram's sum never goes down.
                runs.lateness.observe(self._lateness_bounds, max(lateness.total_seconds(), 0.0))

    def _count_lock_error(self) -> None:
        with self._lock:
            self._lock_errors += 1

    def _scheduler_started(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._heard_at, self._read_failed = now, False

    def _cluster_read(self, status: ClusterStatus | None) -> None:
        """``watch_cluster``'s callback: a fresh status, or ``None`` when the read failed."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            self._heard_at = now
            self._read_failed = status is None
            if status is not None:
                self._status, self._status_at = status, now

    # ---- a scrape (any thread) -----------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        """The metric names, without reading anything (for the registry's clash check)."""
        return self._families()

    def collect(self) -> Iterable[Metric]:
        scheduler = self._scheduler
        jobs = {job.name for job in scheduler.jobs()}
        running = scheduler.running
        now = time.monotonic()
        offset = _backend_clock_offset(scheduler)
        backend = scheduler.backend
        changes = backend.server_changes if isinstance(backend, ServerChanges) else None
        (
            runs,
            duration,
            lateness,
            lock_errors,
            clock_offset,
            up,
            last_success,
            overdue,
            server_changes,
            leader,
        ) = families = self._families()
        leader.add_metric([], 1.0 if running and scheduler.is_leader else 0.0)
        with self._lock:
            # Forgotten at the first scrape after the job's removal: its series go, and a
            # job added again under the name starts from 0.
            for name in [name for name in self._runs if name not in jobs]:
                del self._runs[name]
            for name in sorted(jobs):
                job_runs = self._runs.get(name)
                counts = {} if job_runs is None else job_runs.outcomes
                for outcome in Outcome:
                    runs.add_metric([name, outcome.value], counts.get(outcome.value, 0))
                self._add_histograms(name, job_runs, duration, lateness)
            lock_errors.add_metric([], self._lock_errors)
            heard_in_time = self._heard_at is not None and now - self._heard_at <= self._stale_after
            up.add_metric([], 1.0 if running and heard_in_time and not self._read_failed else 0.0)
            status = self._status
            fresh = (
                running
                and status is not None
                and self._status_at is not None
                and now - self._status_at <= self._stale_after
            )
        if offset is not None:
            clock_offset.add_metric([], offset.total_seconds())
        if changes is not None:
            server_changes.add_metric([], changes)
        if fresh and status is not None:
            for view in status.jobs:
                if not view.registered and view.job not in jobs:
                    continue  # forgotten: its runs are history, nothing expects its ticks
                if view.last_success_at is not None:
                    last_success.add_metric([view.job], view.last_success_at.timestamp())
                overdue.add_metric([view.job], 1.0 if view.overdue else 0.0)
        return families

    def _add_histograms(
        self,
        name: str,
        job_runs: _JobRuns | None,
        duration: HistogramMetricFamily,
        lateness: HistogramMetricFamily,
    ) -> None:
        for family, bounds, histogram in (
            (duration, self._duration_bounds, None if job_runs is None else job_runs.duration),
            (lateness, self._lateness_bounds, None if job_runs is None else job_runs.lateness),
        ):
            observed = _Histogram(len(bounds)) if histogram is None else histogram
            family.add_metric([name], observed.cumulative(bounds), observed.total)

    def _families(
        self,
    ) -> tuple[
        CounterMetricFamily,
        HistogramMetricFamily,
        HistogramMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
        GaugeMetricFamily,
    ]:
        return (
            CounterMetricFamily(
                "replicron_job_runs",
                "Ticks this replica handled, by outcome.",
                labels=["job", "outcome"],
            ),
            HistogramMetricFamily(
                "replicron_job_duration_seconds",
                "How long runs on this replica took, of those that ended.",
                labels=["job"],
            ),
            HistogramMetricFamily(
                "replicron_job_lateness_seconds",
                "How long after its tick a run on this replica started.",
                labels=["job"],
            ),
            CounterMetricFamily(
                "replicron_lock_errors",
                "Times the backend failed to claim, lock or record a tick, or a run lost its lock.",
            ),
            GaugeMetricFamily(
                "replicron_clock_offset_seconds",
                "How far the coordinator's clock is ahead of this process's.",
            ),
            GaugeMetricFamily(
                "replicron_up",
                "1 while the scheduler runs and its latest cluster read succeeded.",
            ),
            GaugeMetricFamily(
                "replicron_job_last_success_timestamp_seconds",
                "When the job's latest successful run in the cluster finished (same on every "
                "replica).",
                labels=["job"],
            ),
            GaugeMetricFamily(
                "replicron_job_overdue",
                "1 when an expected tick of the job has no run past its grace (same on every "
                "replica).",
                labels=["job"],
            ),
            CounterMetricFamily(
                "replicron_server_changes",
                "Times the database server changed under this replica (a failover).",
            ),
            GaugeMetricFamily(
                "replicron_leader", "1 while this replica is the leader (leader mode), else 0."
            ),
        )


class NotifierCollector:
    """``replicron_notifications_total{result}`` of a :class:`~replicron.notify.Notifier`:
    messages ``sent``, ``failed`` (every attempt), ``dropped`` (a full queue, or left at
    shutdown) and ``retried``. Register it next to the :class:`ReplicronCollector`."""

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family, counts = self._family(), self._notifier.counts
        for result, count in (
            ("sent", counts.sent),
            ("failed", counts.failed),
            ("dropped", counts.dropped),
            ("retried", counts.retried),
        ):
            family.add_metric([result], count)
        return [family]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "replicron_notifications",
            "Alerts and pings by what became of them",
            labels=["result"],
        )


def _check_buckets(what: str, buckets: Sequence[float]) -> tuple[float, ...]:
    bounds = tuple(float(bound) for bound in buckets)
    if (
        not bounds
        or not all(math.isfinite(bound) for bound in bounds)
        or any(low >= high for low, high in itertools.pairwise(bounds))
    ):
        raise ConfigurationError(
            f"{what} must be finite bucket bounds in increasing order (+Inf is implied), "
            f"not {buckets!r}"
        )
    return bounds


def _backend_clock_offset(scheduler: Scheduler | AsyncScheduler) -> timedelta | None:
    # Read from any thread by design (one reference, set on the loop).
    return scheduler.backend.clock_offset()
