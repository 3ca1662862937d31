"""The embedded backend never blocks the event loop that awaits it: a claim waiting for another
process's SQLite transaction leaves the loop free for the application."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from replicron import EmbeddedBackend
from replicron.backends import ClaimRequest, ClaimStatus, Release, RunRecord
from replicron.backends._micros import to_micros
from replicron.events import Outcome
from tests.helpers import z

pytestmark = pytest.mark.timeout(60)

#: Seconds the other process holds the ledger's write lock.
HOLD = 1.0
#: The longest the host loop may stall meanwhile: a claim that blocked the loop would stall
#: it for about the whole hold; a loaded machine (the suite runs in several workers on two
#: cores) delays a free loop's wake-ups by tens of milliseconds.
MAX_STALL = HOLD / 4

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


async def _loop_stalls(until: asyncio.Event, period: float = 0.005) -> list[float]:
    """How late each of the host loop's wake-ups came, until ``until`` is set."""
    loop, late = asyncio.get_running_loop(), []
    while not until.is_set():
        before = loop.time()
        await asyncio.sleep(period)
        late.append(loop.time() - before - period)
    return late


def test_a_claim_waiting_for_another_process_leaves_the_loop_free(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path / "state")

    async def scenario() -> tuple[list[ClaimStatus], float, list[float]]:
        await backend.open("host")
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(backend.ledger_path), str(HOLD)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "locked"
            done = asyncio.Event()
            stalls = asyncio.create_task(_loop_stalls(done))
            await asyncio.sleep(0)  # the ticker is waiting when the claim begins
            started = time.monotonic()
            claims = await backend.claim([ClaimRequest("job", z(2026, 1, 1), True)])
            waited = time.monotonic() - started
            done.set()
            return [c.status for c in claims], waited, await stalls
        finally:
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()
            await backend.close()

    statuses, waited, stalls = asyncio.run(scenario())
    assert statuses == [ClaimStatus.CLAIMED]
    assert waited > HOLD / 2  # the claim did wait for the other process's transaction
    assert max(stalls) < MAX_STALL, f"the host loop stalled {max(stalls) * 1000:.0f} ms"
    assert len(stalls) > 20


# ---- callers cancelled while their calls wait -------------------------------------------

#: Holds the ledger's write lock until a line comes on its stdin.
HOLD_UNTIL_TOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""
T1 = z(2026, 1, 1)


class WriteLock:
    """Another process holding the ledger's write lock until :meth:`let_go`."""

    def __init__(self, ledger: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_UNTIL_TOLD, str(ledger)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"

    def let_go(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # its readline() returns: it commits and exits
        self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


async def _waiting(coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """A task of ``coroutine``, once its call is on the backend's thread (waiting there for
    the write lock: a few wake-ups of the loop and a moment for the thread)."""
    task = asyncio.ensure_future(coroutine)
    await asyncio.sleep(0.3)
    assert not task.done()
    return task


async def _cancelled(task: asyncio.Task[Any]) -> float:
    """Cancel ``task``; how long it took to end (its call goes on on the backend's thread)."""
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return time.monotonic() - started


def _rows(ledger: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(ledger)) as conn:
        return conn.execute(
            "SELECT job, scheduled_at, outcome, error FROM replicron_runs ORDER BY run_id"
        ).fetchall()


def test_a_claim_cancelled_while_it_waits_gives_back_what_it_won(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path, busy_timeout=20)

    async def scenario() -> None:
        await backend.open("host")
        holder = WriteLock(backend.ledger_path)
        try:
            claim = await _waiting(
                backend.claim([ClaimRequest("a", T1, True), ClaimRequest("b", T1, False)])
            )
            queued = await _waiting(backend.claim([ClaimRequest("c", T1, True)]))
            assert await _cancelled(claim) < 0.1  # the caller is let go at once
            assert await _cancelled(queued) < 0.1
        finally:
            holder.let_go()
        # The first claim had begun: it ended whole, and then gave back what it won. The
        # second had not: it never ran. The lock of "a" is free again, here and elsewhere.
        [again] = await backend.claim([ClaimRequest("a", z(2026, 1, 1, 0, 1), True)])
        assert (again.status, again.locked) == (ClaimStatus.CLAIMED, True)
        await backend.close()

    asyncio.run(scenario())
    lost = "claimed, but its caller was cancelled before it heard; not run"
    assert _rows(backend.ledger_path) == [
        ("a", to_micros(T1), "missed", lost),
        ("b", to_micros(T1), "missed", lost),
        ("a", to_micros(z(2026, 1, 1, 0, 1)), "abandoned", "replica host closed its backend first"),
    ]


def test_an_outcome_whose_caller_was_cancelled_is_still_recorded(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path, busy_timeout=20)

    async def scenario() -> None:
        await backend.open("host")
        [claim] = await backend.claim([ClaimRequest("a", T1, True)])
        holder = WriteLock(backend.ledger_path)
        try:
            record = RunRecord("a", T1, Outcome.SUCCEEDED, "host", claim.run_id, T1, T1, None)
            release = await _waiting(backend.release([Release(record, True)]))
            assert await _cancelled(release) < 0.1
        finally:
            holder.let_go()
        [after] = await backend.claim([ClaimRequest("a", z(2026, 1, 1, 0, 1), True)])
        assert after.locked  # the release unlocked it, after its outcome was committed
        await backend.close()

    asyncio.run(scenario())
    assert _rows(backend.ledger_path)[0] == ("a", to_micros(T1), "succeeded", None)


def test_an_open_cancelled_while_it_waits_leaves_nothing_open(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path, busy_timeout=20)
    asyncio.run(_open_and_close(backend))  # the ledger exists, with its schema

    async def scenario() -> None:
        holder = WriteLock(backend.ledger_path)
        try:  # the janitor at open waits for the write lock (an open row of a dead process)
            opening = await _waiting(backend.open("host"))
            assert await _cancelled(opening) < 0.1
        finally:
            holder.let_go()
        await _open_and_close(backend)  # it can be opened again: nothing was left open

    with contextlib.closing(sqlite3.connect(backend.ledger_path)) as conn:
        conn.execute(
            "INSERT INTO replicron_runs (job, scheduled_at, replica_id, pid, claimed_at)"
            " VALUES ('a', 0, 'gone', 999999999, 0)"
        )
        conn.commit()
    asyncio.run(scenario())


async def _open_and_close(backend: EmbeddedBackend) -> None:
    await backend.open("host")
    await backend.close()
