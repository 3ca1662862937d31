"""Shared fixtures: every test must leave no replicron thread running."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith("replicron-") and t.is_alive()
    ]
    for thread in leaked:
        thread.join(timeout=5)  # a worker finishing the task it was given at shutdown
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"threads left running: {still}"
