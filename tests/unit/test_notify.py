"""The notifier against a real HTTP server on 127.0.0.1: alert payloads, the function form,
dead-man's-switch pings, retries, give-up, a hanging endpoint, a full queue, masked secrets,
and overdue alerts from a real (embedded) backend's registry."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from replicron import (
    AsyncScheduler,
    EmbeddedBackend,
    InvalidNotifierError,
    Outcome,
    RunEvent,
    Scheduler,
    every,
)
from replicron.cluster import ClusterStatus
from replicron.metrics import NotifierCollector
from replicron.notify import Notifier
from replicron.testing import FakeClock
from tests.helpers import START, Recorder
from tests.receiver import receiving

T1 = START + timedelta(seconds=10)
SECRET = "Hunter2Secret"


def broken() -> None:
    raise RuntimeError(f"cannot reach postgresql://etl:{SECRET}@dw.internal/dw")


def fine() -> None:
    pass


def failed_event(job: str = "etl") -> RunEvent:
    return RunEvent(
        job,
        T1,
        "r1",
        run_id=7,
        outcome=Outcome.FAILED,
        started_at=T1,
        finished_at=T1 + timedelta(seconds=2),
        error=RuntimeError("boom"),
    )


def test_each_run_that_went_wrong_is_posted_once_with_its_fields() -> None:
    async def main(url: str) -> Notifier:
        clock = FakeClock(START)
        recorder = Recorder()
        notifier = Notifier(
            url, link="https://ops.example/jobs/{job}?run={run_id}", namespace="billing/"
        )

        async def slow() -> None:
            await asyncio.Event().wait()

        s = AsyncScheduler(clock=clock, listeners=[recorder], replica_id="r1")
        notifier.attach(s)
        s.add_job(every(seconds=10), broken, name="etl")
        s.add_job(every(seconds=10), fine, name="fine")
        s.add_job(every(seconds=10), slow, name="slow", timeout=5)
        s.add_job(every(seconds=10), slow, name="stuck")
        await s.start()
        await asyncio.to_thread(clock.wait_for_sleepers, 1)
        clock.set(T1)
        await recorder.await_count("before_run", 4)
        await recorder.await_count("after_failure", 1)
        clock.set(T1 + timedelta(seconds=5))  # slow's deadline
        await recorder.await_count("on_timeout", 1)
        await s.shutdown(timeout=0.01)  # stuck is cut off
        return notifier

    with receiving() as receiver:
        notifier = asyncio.run(main(receiver.url()))
        bodies = {r.json()["event"]: r.json() for r in receiver.wait_for(3)}
        assert notifier.flush(5)
        assert len(receiver.received) == 3  # nothing for the success
    assert sorted(bodies) == ["abandoned", "failed", "timed_out"]
    failed = bodies["failed"]
    assert failed == {
        "event": "failed",
        "job": "etl",
        "tick": T1.isoformat(),
        "outcome": "failed",
        "error": "RuntimeError: cannot reach postgresql://etl:***@dw.internal/dw",
        "replica": "r1",
        "run_id": failed["run_id"],
        "duration": failed["duration"],
        "namespace": "billing/",
        "manual": False,
        "link": f"https://ops.example/jobs/etl?run={failed['run_id']}",
        "text": f"replicron: job 'etl' failed (tick {T1.isoformat()}, replica r1): "
        "RuntimeError: cannot reach postgresql://etl:***@dw.internal/dw "
        f"https://ops.example/jobs/etl?run={failed['run_id']}",
    }
    assert isinstance(failed["run_id"], int)
    assert failed["duration"] >= 0
    assert bodies["timed_out"]["job"] == "slow"
    assert bodies["timed_out"]["outcome"] == "timed_out"
    assert bodies["abandoned"]["job"] == "stuck"
    assert bodies["abandoned"]["outcome"] == "abandoned"
    assert notifier.counts.sent == 3


def test_the_function_form_gets_the_same_dict_filtered_by_job_and_fields() -> None:
    calls: list[dict[str, Any]] = []
    clock = FakeClock(START)
    notifier = Notifier(
        call=calls.append,
        jobs=["etl"],
        fields=["event", "job", "error"],
        events=["failed", "succeeded"],
    )
    s = Scheduler(clock=clock, replica_id="r1")
    notifier.attach(s)
    s.add_job(every(seconds=10), broken, name="etl")
    s.add_job(every(seconds=10), broken, name="other")
    with s:
        assert clock.wait_for_sleepers(1)
        clock.set(T1)
        s.wait_idle()
        assert notifier.flush(5)
    assert calls == [
        {
            "event": "failed",
            "job": "etl",
            "error": "RuntimeError: cannot reach postgresql://etl:***@dw.internal/dw",
        }
    ]


def test_tags_pick_the_jobs_alerted_on() -> None:
    calls: list[dict[str, Any]] = []
    clock = FakeClock(START)
    notifier = Notifier(call=calls.append, tags=["critical"])
    s = Scheduler(clock=clock, replica_id="r1")
    notifier.attach(s)
    s.add_job(every(seconds=10), broken, name="billing", tags=["critical", "money"])
    s.add_job(every(seconds=10), broken, name="cleanup", tags=["chores"])
    with s:
        assert clock.wait_for_sleepers(1)
        clock.set(T1)
        s.wait_idle()
        assert notifier.flush(5)
    assert [call["job"] for call in calls] == ["billing"]


def test_pings_go_start_then_success_or_fail_with_the_error() -> None:
    clock = FakeClock(START)
    with receiving() as receiver:
        notifier = Notifier(
            pings={"good": receiver.url("/ping/good-uuid"), "bad": receiver.url("/ping/bad-uuid/")}
        )
        s = Scheduler(clock=clock, replica_id="r1", listeners=[notifier])
        s.add_job(every(seconds=10), fine, name="good")
        s.add_job(every(seconds=10), broken, name="bad")
        s.add_job(every(seconds=10), fine, name="unpinged")
        with s:
            assert clock.wait_for_sleepers(1)
            clock.set(T1)
            s.wait_idle()
            assert notifier.flush(5)
        pings = receiver.wait_for(4)
    paths = [r.path for r in pings]
    assert [p for p in paths if "good" in p] == ["/ping/good-uuid/start", "/ping/good-uuid"]
    assert [p for p in paths if "bad" in p] == ["/ping/bad-uuid/start", "/ping/bad-uuid/fail"]
    [fail] = [r for r in pings if r.path.endswith("/fail")]
    assert fail.body.decode() == "RuntimeError: cannot reach postgresql://etl:***@dw.internal/dw"
    assert all(r.method == "POST" for r in pings)


def test_a_failed_delivery_is_retried_until_it_succeeds() -> None:
    with receiving() as receiver:
        receiver.statuses = [500, 503]
        notifier = Notifier(receiver.url(), backoff=0.01, attempts=5)
        notifier.after_failure(failed_event())
        assert notifier.flush(10)
        tries = receiver.wait_for(3)
    assert len({r.body for r in tries}) == 1
    assert tries[0].json()["job"] == "etl"
    counts = notifier.counts
    assert (counts.sent, counts.failed, counts.retried, counts.dropped) == (1, 0, 2, 0)
    registry = CollectorRegistry()
    registry.register(NotifierCollector(notifier))
    assert {
        result: registry.get_sample_value("replicron_notifications_total", {"result": result})
        for result in ("sent", "failed", "dropped", "retried")
    } == {"sent": 1, "failed": 0, "dropped": 0, "retried": 2}


def test_a_delivery_is_given_up_after_its_attempts_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "replicron.notify")
    with receiving() as receiver:
        receiver.statuses = [500] * 10
        notifier = Notifier(receiver.url(), backoff=0.01, attempts=3)
        notifier.after_failure(failed_event())
        assert notifier.flush(10)
        assert len(receiver.received) == 3
        receiver.statuses = [403]  # refused: no retry changes that
        notifier.after_failure(failed_event())
        assert notifier.flush(10)
        assert len(receiver.received) == 4
    assert notifier.counts.failed == 2
    assert notifier.counts.sent == 0
    given_up = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(given_up) == 2
    assert "not delivered after 3 attempts: OSError: HTTP 500" in given_up[0]
    assert "HTTP 403" in given_up[1]
    record = vars(next(r for r in caplog.records if r.levelno == logging.WARNING))
    assert (record["event"], record["job"], record["tick"], record["run_id"]) == (
        "notify_failed",
        "etl",
        T1.isoformat(),
        7,
    )


def test_a_hanging_endpoint_delays_no_run_and_a_stop_only_by_flush_timeout() -> None:
    clock = FakeClock(START)
    with receiving() as receiver:
        receiver.hang.set()
        notifier = Notifier(
            receiver.url(), pings={"etl": receiver.url("/ping/x")}, timeout=30, flush_timeout=0.5
        )
        recorder = Recorder()
        s = Scheduler(clock=clock, replica_id="r1", listeners=[recorder])
        notifier.attach(s)
        s.add_job(every(seconds=10), broken, name="etl")
        s.start()
        try:
            began = time.monotonic()
            for n in range(1, 6):
                assert clock.wait_for_sleepers(1)
                clock.set(START + n * timedelta(seconds=10))
                recorder.wait_count("after_failure", n)
            five_ticks = time.monotonic() - began
            receiver.wait_for(1)  # the first ping hangs at the endpoint meanwhile
        finally:
            stop_began = time.monotonic()
            s.shutdown()
            stopping = time.monotonic() - stop_began
    # A run waiting for the endpoint would take 30 s (the request timeout) for the first.
    assert five_ticks < 10, five_ticks
    assert stopping < 10, stopping
    assert notifier.counts.dropped >= 10  # 5 alerts + 10 pings queued, 1 at the endpoint


def test_a_full_queue_drops_its_oldest_message_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with receiving() as receiver:
        receiver.hang.set()
        notifier = Notifier(receiver.url(), max_queue=2, timeout=30, flush_timeout=0.1)
        notifier.after_failure(failed_event("first"))
        receiver.wait_for(1)  # on its way, out of the queue
        for job in ("a", "b", "c"):
            notifier.after_failure(failed_event(job))
        assert notifier.counts.dropped == 1
        receiver.hang.clear()
        assert notifier.flush(20)
        jobs = [r.json()["job"] for r in receiver.wait_for(3)]
    assert jobs == ["first", "b", "c"]
    assert "notifier queue full (2 messages): dropped the oldest, alert failed of job 'a'" in (
        caplog.text
    )


def test_no_secret_of_a_url_or_header_shows_in_logs_errors_or_repr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with receiving() as receiver:
        receiver.statuses = [500] * 3
        url = f"http://hook:pa55word@127.0.0.1:{receiver.port}/services/T0/B0/SECRETTOKEN?token=qwerty123"
        notifier = Notifier(
            url,
            headers={"Authorization": "Bearer sekrit-value"},
            backoff=0.01,
            attempts=3,
            pings={"etl": f"http://127.0.0.1:{receiver.port}/0f1e2d3c-uuid-ping"},
        )
        notifier.after_failure(failed_event())
        assert notifier.flush(10)
        got = receiver.wait_for(4)
    alert = next(r for r in got if r.path.startswith("/services"))
    assert alert.headers["Authorization"] == "Bearer sekrit-value"  # the header wins
    with pytest.raises(InvalidNotifierError) as bad:
        Notifier("ftp://u:pw12345@host/x?token=abcd5678")
    with pytest.raises(InvalidNotifierError) as bad_ping:
        Notifier(pings={"etl": "hc-ping.com/0f1e2d3c-uuid"})
    shown = caplog.text + repr(notifier) + str(bad.value) + str(bad_ping.value)
    for secret in (
        "pa55word",
        "SECRETTOKEN",
        "qwerty123",
        "sekrit-value",
        "0f1e2d3c-uuid",
        "pw12345",
        "abcd5678",
        "hook:",
    ):
        assert secret not in shown
    assert f"http://127.0.0.1:{receiver.port}/***" in caplog.text
    assert repr(notifier) == (
        f"Notifier(http://127.0.0.1:{receiver.port}/***, events=['abandoned', 'failed', "
        "'overdue', 'timed_out'], pings=['etl'], headers=['Authorization'])"
    )


def test_basic_auth_in_the_url_is_sent_as_a_header() -> None:
    with receiving() as receiver:
        notifier = Notifier(f"http://hook:pa55@127.0.0.1:{receiver.port}/hook")
        notifier.after_failure(failed_event())
        [got] = receiver.wait_for(1)
        notifier.close()
    assert got.headers["Authorization"] == "Basic aG9vazpwYTU1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://example.com/x"}, "notifier url: must be an http:// or https:// URL"),
        ({"url": "https:///path"}, "notifier url: the URL has no host"),
        ({"url": 5}, "notifier url: must be an http(s) URL string, not 5"),
        ({"events": ["fialed"]}, "notifier events: unknown name 'fialed' (known: failed"),
        ({"fields": ["jobb"]}, "notifier fields: unknown name 'jobb'"),
        (
            {"pings": {"nightly": "mailto:ops@example.com"}},
            "notifier: job 'nightly': ping URL: must be an http:// or https:// URL",
        ),
        ({"pings": {" x": "https://hc-ping.com/u"}}, "notifier pings: job name ' x'"),
        ({"link": "https://x/{jobname}"}, "notifier link: unknown placeholder {jobname}"),
        ({"attempts": 0}, "notifier attempts: must be at least 1"),
        ({"timeout": float("inf")}, "notifier timeout: must be a finite number"),
        ({"headers": {"X-Token": "a\nb"}}, "notifier headers: X-Token: the value must be"),
        ({"url": "https://x/h", "call": print}, "notifier: give url or call, not both"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidNotifierError) as raised:
        Notifier(**kwargs)
    assert message in str(raised.value)


def test_an_async_function_is_refused() -> None:
    async def post(payload: dict[str, Any]) -> None:
        pass

    with pytest.raises(InvalidNotifierError, match="notifier call: must be a plain function"):
        Notifier(call=post)


def _leave_an_overdue_job(tmp_path: Path) -> None:
    """A replica that scheduled ``etl`` every 10 s and went away before its first tick: by
    the host's clock (the embedded registry's), that tick is long overdue."""
    old = Scheduler(clock=FakeClock(START), backend=EmbeddedBackend(tmp_path), replica_id="old")
    old.add_job(every(seconds=10), fine, name="etl")
    old.start()
    old.shutdown()


def test_an_overdue_job_is_alerted_once_by_one_of_the_live_replicas(tmp_path: Path) -> None:
    _leave_an_overdue_job(tmp_path)
    reads: list[ClusterStatus | None] = []
    read = threading.Condition()

    def note(status: ClusterStatus | None) -> None:
        with read:
            reads.append(status)
            read.notify_all()

    with receiving() as receiver:
        replicas = []
        for replica in ("b-replica", "a-replica"):
            s = Scheduler(
                clock=FakeClock(START), backend=EmbeddedBackend(tmp_path), replica_id=replica
            )
            Notifier(receiver.url(), overdue_every=0.05).attach(s)
            replicas.append(s)
        replicas[0].watch_cluster(note, 0.05)
        for s in replicas:
            s.start()
        try:
            [alert] = receiver.wait_for(1)
            with read:  # both notifiers read the cluster a few more times meanwhile
                seen = len(reads)
                assert read.wait_for(lambda: len(reads) >= seen + 5, 20)
        finally:
            for s in replicas:
                s.shutdown()
        assert len(receiver.received) == 1
    body = alert.json()
    assert (body["event"], body["job"], body["replica"]) == ("overdue", "etl", "a-replica")
    assert body["tick"] == T1.isoformat()
    overdue = f"replicron: job 'etl' overdue: the tick due at {T1.isoformat()} has no run"
    assert body["text"].startswith(overdue)
