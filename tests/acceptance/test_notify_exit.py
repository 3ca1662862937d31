"""A process that ends while its notifier is mid-request, at an endpoint that never
answers: the interpreter exits at once (the notifier's threads do not hold it), and a
scheduler's stop still gives the queue its ``flush_timeout``, no more."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import sys
from datetime import datetime, timezone
from replicron import Outcome, RunEvent, Scheduler
from replicron.notify import Notifier

notifier = Notifier(sys.argv[1], timeout=60, flush_timeout=2)
event = RunEvent("etl", datetime.now(timezone.utc), "r1", run_id=1, outcome=Outcome.FAILED)
if sys.argv[2] == "stop":
    scheduler = Scheduler(replica_id="r1")
    notifier.attach(scheduler)
    scheduler.start()
    notifier.after_failure(event)
    notifier.after_failure(event)
    scheduler.shutdown()
else:
    notifier.after_failure(event)
    assert not notifier.flush(0.5)  # the request is under way, and unanswered
print("done", notifier.counts, flush=True)
"""


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that takes every connection and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize(("how", "at_most"), [("exit", 15.0), ("stop", 20.0)])
def test_a_process_ends_promptly_with_a_request_unanswered(
    silent_endpoint: str, how: str, at_most: float
) -> None:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), silent_endpoint, how],
        capture_output=True,
        text=True,
        timeout=90,
    )
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("done"), done.stdout
    # The request alone would hold on for its 60 s timeout; a stop, for flush_timeout (2 s).
    assert took < at_most, took
    if how == "stop":
        assert "dropped=1" in done.stdout, done.stdout
        assert "notifier stopped with 1 messages undelivered after 2.0 s" in done.stderr
