"""The notifier against misbehaving endpoints and uses that strain it: an answer one byte at
a time, a redirect, a burst into a full queue, a stop with the endpoint hung, a function that
raises SystemExit or quotes its URL, one notifier shared by two schedulers, a silent ping
endpoint next to a working alert endpoint."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from replicron import AsyncScheduler, EmbeddedBackend, InvalidNotifierError, Scheduler
from replicron.notify import Notifier
from replicron.testing import FakeClock
from tests.helpers import START
from tests.receiver import dripping, receiving
from tests.unit.test_notify import _leave_an_overdue_job, failed_event


def test_a_function_raising_system_exit_does_not_end_the_deliveries() -> None:
    calls: list[str] = []

    def pager(payload: dict[str, Any]) -> None:
        calls.append(payload["job"])
        if len(calls) == 1:
            raise SystemExit(2)  # on a thread that only ends the thread, silently

    notifier = Notifier(call=pager, backoff=0.01)
    notifier.after_failure(failed_event("first"))
    notifier.after_failure(failed_event("second"))
    assert notifier.flush(10)
    assert sorted(calls) == ["first", "first", "second"]
    assert (notifier.counts.sent, notifier.counts.retried) == (2, 1)


def test_an_endpoint_answering_a_byte_at_a_time_is_cut_off_after_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "replicron.notify")
    with dripping() as url:
        notifier = Notifier(url, timeout=0.5, attempts=2, backoff=0.01)
        began = time.monotonic()
        notifier.after_failure(failed_event())
        # Each read gets its byte within the timeout: only a bound on the whole request ends it.
        assert notifier.flush(30)
        took = time.monotonic() - began
    assert (notifier.counts.failed, notifier.counts.retried, notifier.counts.sent) == (1, 1, 0)
    assert took < 15, took  # two attempts of 0.5 s, on a loaded machine
    assert "not delivered after 2 attempts: TimeoutError" in caplog.text


def test_a_redirect_is_not_followed_so_credentials_stay_with_the_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with receiving() as endpoint, receiving() as elsewhere:
        endpoint.statuses = [302, 307]
        endpoint.location = elsewhere.url("/collect")
        notifier = Notifier(
            endpoint.url().replace("//", "//user:pass-word@"),
            headers={"X-Api-Key": "key-123"},
            attempts=3,
            backoff=0.01,
        )
        notifier.after_failure(failed_event("a"))
        notifier.after_failure(failed_event("b"))
        assert notifier.flush(10)
        assert len(endpoint.received) == 2  # a redirect stays one: no retries
    # Followed, a 302 turns the POST into a bodiless GET and takes the basic authentication
    # and the headers to whatever host the Location names.
    assert elsewhere.received == []
    assert (notifier.counts.sent, notifier.counts.failed) == (0, 2)
    assert "redirect" in caplog.text


def test_a_stop_waits_for_the_flush_without_holding_the_event_loop() -> None:
    async def main(url: str) -> tuple[float, float]:
        notifier = Notifier(url, timeout=30, flush_timeout=2)
        s = AsyncScheduler(clock=FakeClock(START), replica_id="r1")
        notifier.attach(s)
        await s.start()
        for job in ("held", "a", "b"):
            notifier.after_failure(failed_event(job))
        stalls: list[float] = []
        stopped = asyncio.Event()

        async def beat() -> None:  # what else the application runs on its loop
            last = time.monotonic()
            while not stopped.is_set():
                await asyncio.sleep(0.01)
                stalls.append(time.monotonic() - last)
                last = time.monotonic()

        beating = asyncio.create_task(beat())
        began = time.monotonic()
        await s.shutdown()
        stopping = time.monotonic() - began
        stopped.set()
        await beating
        return stopping, max(stalls)

    with receiving() as receiver:
        receiver.hang.set()
        stopping, longest_stall = asyncio.run(main(receiver.url()))
    assert stopping >= 1.5, stopping  # the stop still gave the queue its flush_timeout
    assert longest_stall < 1, longest_stall  # held, it stalled for all of it (2 s)


def _drops_from_a_full_queue(max_queue: int, dropped: int) -> float:
    """CPU seconds of the calling thread for ``dropped`` failures queued into a full queue of
    ``max_queue`` that the held endpoint never drains (each drops the oldest). The queue is
    filled first, untimed; the thread's own CPU time leaves out what other processes and
    threads take meanwhile."""
    with receiving() as receiver:
        receiver.hang.set()
        notifier = Notifier(receiver.url(), max_queue=max_queue, timeout=30, flush_timeout=0.1)
        notifier.after_failure(failed_event("first"))
        receiver.wait_for(1)  # held at the endpoint: the queue only fills
        for n in range(max_queue):
            notifier.after_failure(failed_event(f"fill-{n}"))
        events = [failed_event(f"job-{n}") for n in range(dropped)]
        began = time.thread_time()
        for event in events:
            notifier.after_failure(event)
        took = time.thread_time() - began
        assert notifier.counts.dropped == dropped
        notifier.close()
    return took


def test_a_burst_into_a_full_queue_costs_each_message_little() -> None:
    # The hooks run on the scheduler's loop: dropping the oldest must not scan the queue.
    # As many drops from a full queue 400 times larger, in the same run, the least of three
    # tries each: from a heap they cost about as much (measured 1.1 times); with a scan of
    # the queue at each drop, about 8 times as much.
    small = min(_drops_from_a_full_queue(max_queue=50, dropped=5000) for _ in range(3))
    large = min(_drops_from_a_full_queue(max_queue=20_000, dropped=5000) for _ in range(3))
    assert large < 3 * small, (large, small)


def test_a_function_is_named_without_its_arguments_and_urls_in_its_errors_are_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "replicron.notify")
    webhook = "https://hooks.slack.com/services/T0/B0/PARTIALSECRET"

    def post(url: str, payload: dict[str, Any]) -> None:
        # As HTTP clients word it (httpx): the URL, whole, in the exception's text.
        raise ConnectionError(f"Server error '503 Service Unavailable' for url '{url}'")

    notifier = Notifier(call=functools.partial(post, webhook), attempts=2, backoff=0.01)
    notifier.after_failure(failed_event())
    assert notifier.flush(10)
    with pytest.raises(InvalidNotifierError) as bad:
        Notifier(call=webhook)  # type: ignore[arg-type]  # a URL given as the function
    shown = caplog.text + str(bad.value) + repr(notifier)
    assert "PARTIALSECRET" not in shown
    assert "to function test_a_function_is_named" in caplog.text
    assert "for url 'https://hooks.slack.com/***'" in caplog.text


def test_one_notifier_attached_to_two_schedulers_serves_both(tmp_path: Path) -> None:
    _leave_an_overdue_job(tmp_path)
    with receiving() as receiver:
        notifier = Notifier(receiver.url(), overdue_every=0.05)
        replicas = []
        for replica in ("a-replica", "b-replica"):  # a-replica, the smallest id, sends
            s = Scheduler(
                clock=FakeClock(START), backend=EmbeddedBackend(tmp_path), replica_id=replica
            )
            notifier.attach(s)
            replicas.append(s)
        for s in replicas:
            s.start()
        try:
            [alert] = receiver.wait_for(1)
        finally:
            for s in replicas:
                s.shutdown()
    assert (alert.json()["event"], alert.json()["replica"]) == ("overdue", "a-replica")


def test_a_shared_notifier_stops_with_the_last_of_its_schedulers() -> None:
    with receiving() as receiver:
        receiver.hang.set()
        notifier = Notifier(receiver.url(), timeout=30, flush_timeout=0.1)
        first, second = (Scheduler(clock=FakeClock(START), replica_id=r) for r in ("r1", "r2"))
        detach_first = notifier.attach(first)
        notifier.attach(second)
        first.start()
        second.start()
        try:
            notifier.after_failure(failed_event("held"))
            receiver.wait_for(1)
            notifier.after_failure(failed_event("queued"))
            first.shutdown()
            detach_first()
            dropped_while_second_runs = notifier.counts.dropped
        finally:
            first.shutdown()
            second.shutdown()
    assert dropped_while_second_runs == 0  # the second's alerts still go
    assert notifier.counts.dropped == 1  # its stop flushed and dropped


def test_a_silent_ping_endpoint_does_not_hold_the_alerts_up() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    silent = f"http://127.0.0.1:{listener.getsockname()[1]}/0f1e-uuid"
    try:
        with receiving() as receiver:
            notifier = Notifier(receiver.url(), pings={"etl": silent}, timeout=20, attempts=1)
            for _ in range(3):
                notifier.before_run(failed_event("etl"))  # each would wait out its 20 s
            notifier.after_failure(failed_event("other"))
            [alert] = receiver.wait_for(1, timeout=10)
            notifier.close(0)
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert alert.json()["job"] == "other"
