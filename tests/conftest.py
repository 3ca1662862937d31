"""Shared fixtures: every test must leave no replicron thread running, and the garbage
collector enabled (schedulers hold it back while an instant's runs start)."""

from __future__ import annotations

import gc
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


@pytest.fixture(autouse=True)
def collector_enabled_after() -> Iterator[None]:
    yield
    if not gc.isenabled():
        gc.enable()  # so that the tests after this one are not affected
        pytest.fail("the test left the garbage collector disabled")
