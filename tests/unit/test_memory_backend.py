"""The memory backend's record of claimed ticks: bounded, and never losing a backlog."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from replicron import MemoryBackend
from replicron.backends import ClaimRequest, ClaimStatus, memory
from tests.helpers import z

START = z(2026, 1, 1)
KEPT = 16  # an eighth of them, 2, are dropped at once


def tick(k: int) -> ClaimRequest:
    return ClaimRequest("job", START + timedelta(seconds=k), False)


def claim(backend: MemoryBackend, *requests: ClaimRequest) -> list[ClaimStatus]:
    return [c.status for c in asyncio.run(backend.claim(requests))]


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> MemoryBackend:
    monkeypatch.setattr(memory, "TICKS_KEPT", KEPT)
    backend = MemoryBackend()
    asyncio.run(backend.open("r1"))
    return backend


CLAIMED, TAKEN = ClaimStatus.CLAIMED, ClaimStatus.TAKEN


def test_a_backlog_claimed_among_newer_ticks_is_kept_whole(backend: MemoryBackend) -> None:
    # Old ticks 1, 2, ... claimed among the job's regular ticks (1000, 1001, ...), seven
    # eighths of KEPT of them in all.
    newer = KEPT - KEPT // 8
    assert claim(backend, tick(0)) == [CLAIMED]
    for k in range(1, newer + 1):
        assert claim(backend, tick(999 + k), tick(k)) == [CLAIMED, CLAIMED]
    # Every claimed tick is still taken, the earliest ones because they were dropped.
    for k in [*range(newer + 1), *range(1000, 1000 + newer)]:
        assert claim(backend, tick(k)) == [TAKEN], k
    assert claim(backend, tick(newer + 1)) == [CLAIMED]  # the backlog goes on


def test_the_record_stays_bounded_and_dropped_ticks_stay_taken(backend: MemoryBackend) -> None:
    for k in range(5 * KEPT):
        assert claim(backend, tick(k)) == [CLAIMED]
    assert KEPT - KEPT // 8 <= len(backend.state.jobs["job"].claimed) <= KEPT
    assert claim(backend, tick(0), tick(4 * KEPT - 1), tick(5 * KEPT - 1)) == [TAKEN] * 3
    assert claim(backend, tick(5 * KEPT)) == [CLAIMED]
