"""The embedded backend never blocks the event loop that awaits it: a claim waiting for another
process's SQLite transaction leaves the loop free for the application."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replicron import EmbeddedBackend
from replicron.backends import ClaimRequest, ClaimStatus
from tests.helpers import z

pytestmark = pytest.mark.timeout(60)

#: Seconds the other process holds the ledger's write lock.
HOLD = 1.0
#: The longest the host loop may stall meanwhile.
MAX_STALL = 0.020

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
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
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
