"""Shared fixtures: every test must leave no replicron thread running, and the garbage
collector enabled and not held back (schedulers with defer_gc=True hold it back while an
instant's runs start)."""

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
    from replicron._engine.collector import holding

    if not gc.isenabled() or holding():
        gc.enable()  # so that the tests after this one are not affected
        gc.set_threshold(700, 10, 10)
        pytest.fail("the test left the garbage collector disabled or held back")
