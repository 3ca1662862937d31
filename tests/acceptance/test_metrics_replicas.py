"""Two replica processes on one PostgreSQL, each serving its metrics over HTTP: the cluster's
last success of a job is one value on every replica, moves forward with each success and
stands still through failures.

The job succeeds or fails as a flag file of the test says (``--fail-while`` of
``tests/_harness/replica.py``); the expected values come from the backend's ledger,
``replicron_runs``.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.conftest import Cluster

JOB = "metered"
EVERY_S = 1.0  # the job's interval
CLUSTER_EVERY = 0.5  # how often each replica reads the cluster's view
#: Seconds for anything the replicas should do within a few ticks and reads.
SOON = 20.0
#: A float timestamp keeps the ledger's microseconds to well within this.
SAME_INSTANT = 1e-3

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class MetricsReplica:
    """A replica process serving its metrics, whose job fails while the flag file says so."""

    def __init__(self, cluster: Cluster, replica_id: str, flag_file: Path) -> None:
        self.cluster, self.replica_id = cluster, replica_id
        cluster.start(
            replica_id,
            job=JOB,
            every_s=EVERY_S,
            task_ms=0,
            runs_table=False,
            fail_while=flag_file,
            metrics=True,
            cluster_every=CLUSTER_EVERY,
        )
        self._port: int | None = None

    def ready(self) -> bool:
        if self._port is None:
            pid = self.cluster[self.replica_id].pid
            ready = [e for e in self.cluster.events("ready") if e["pid"] == pid]
            self._port = int(ready[0]["metrics_port"]) if ready else None
        return self._port is not None

    def scrape(self) -> Samples:
        assert self._port is not None, "not ready"
        url = f"http://127.0.0.1:{self._port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def last_success(samples: Samples) -> float | None:
    return value(samples, "replicron_job_last_success_timestamp_seconds", job=JOB)


def runs(samples: Samples, outcome: str) -> float:
    counted = value(samples, "replicron_job_runs_total", job=JOB, outcome=outcome)
    assert counted is not None, f"no runs_total series for {outcome}"
    return counted


class Replicas:
    def __init__(self, cluster: Cluster, replicas: list[MetricsReplica]) -> None:
        self.cluster, self.replicas = cluster, replicas

    def scrape_all(self) -> dict[str, Samples]:
        return {r.replica_id: r.scrape() for r in self.replicas}

    def agreed_last_success(self) -> float | None:
        """The last success every replica reports, once they report the same one."""
        reported = {last_success(samples) for samples in self.scrape_all().values()}
        [only] = reported if len(reported) == 1 else [None]
        return only

    def wait_agreed(self, what: str, after: float | None = None) -> float:
        """Wait until every replica reports one last success, later than ``after``."""

        def agreed() -> float | None:
            found = self.agreed_last_success()
            return found if found is not None and (after is None or found > after) else None

        return self.cluster.wait_until(what, agreed, timeout=SOON)

    def ledger_last_success(self) -> float:
        [(finished,)] = self.cluster.rows(
            "SELECT max(finished_at) FROM replicron_runs WHERE job = %s AND outcome = 'succeeded'",
            (JOB,),
        )
        assert isinstance(finished, datetime)
        return finished.timestamp()

    def failed_runs_in_ledger(self) -> int:
        [(count,)] = self.cluster.rows(
            "SELECT count(*) FROM replicron_runs WHERE job = %s AND outcome = 'failed'", (JOB,)
        )
        return int(count)


@pytest.mark.timeout(150)
def test_replicas_report_one_cluster_last_success_that_only_successes_move(
    cluster: Cluster, tmp_path: Path, summary: Callable[[str], None]
) -> None:
    flag = tmp_path / "flag"
    flag.write_text("succeed")
    replicas = Replicas(cluster, [MetricsReplica(cluster, r, flag) for r in ("m1", "m2")])
    cluster.wait_until(
        "both replicas to serve metrics", lambda: all(r.ready() for r in replicas.replicas), SOON
    )

    first = replicas.wait_agreed("a first success reported by both replicas")
    later = replicas.wait_agreed("a later success reported by both", first)
    assert later > first

    flag.write_text("fail")
    failed_before = replicas.failed_runs_in_ledger()
    cluster.wait_until(
        "three failed runs in the ledger",
        lambda: replicas.failed_runs_in_ledger() >= failed_before + 3,
        timeout=SOON,
    )
    # The ledger's last success is the one before the flip (or a run under way at it): the
    # replicas come to report exactly that, and keep to it while failures go on.
    expected = replicas.ledger_last_success()
    settled = replicas.wait_agreed(
        "both replicas to report the ledger's last success", expected - SAME_INSTANT
    )
    assert abs(settled - expected) < SAME_INSTANT
    failed_seen = replicas.failed_runs_in_ledger()
    deadline = time.monotonic() + 4 * EVERY_S
    while time.monotonic() < deadline or replicas.failed_runs_in_ledger() < failed_seen + 2:
        for replica_id, samples in replicas.scrape_all().items():
            reported = last_success(samples)
            assert reported is not None, replica_id
            assert abs(reported - expected) < SAME_INSTANT, (
                f"{replica_id} reports {reported}, the ledger {expected}, after failures"
            )
        cluster.check_alive()
        time.sleep(0.1)
    assert replicas.ledger_last_success() == expected

    flag.write_text("succeed")
    recovered = replicas.wait_agreed("a success after the failures", expected)
    assert recovered > expected

    # The failures are over; each one ran on one replica, which counted it.
    scraped = replicas.scrape_all()
    failed = sum(runs(samples, "failed") for samples in scraped.values())
    succeeded = sum(runs(samples, "succeeded") for samples in scraped.values())
    assert failed == replicas.failed_runs_in_ledger()
    assert succeeded >= 3
    for replica_id, samples in scraped.items():
        assert value(samples, "replicron_up") == 1, replica_id
        assert value(samples, "replicron_job_overdue", job=JOB) == 0, replica_id
        assert value(samples, "replicron_clock_offset_seconds") is not None, replica_id
    codes = cluster.stop()
    assert codes == {"m1": 0, "m2": 0}
    summary(
        f"metrics: last success agreed by 2 replicas, {succeeded:.0f} succeeded and "
        f"{failed:.0f} failed runs counted, last success held through the failures"
    )
