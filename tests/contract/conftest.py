"""One backend contract, every backend.

The ``backends`` fixture is parametrised over :data:`STORES`: each entry makes a *store* (the
shared state replicas coordinate through: one ``MemoryState``, one fresh PostgreSQL database,
one fresh embedded state directory)
and knows how to make a handle on it and how to read back the outcomes it recorded. A new
backend (``embedded``) is one more entry.

Tests drive the handles on one event loop per test (:class:`asyncio.Runner`, no
pytest-asyncio): ``backends.run(main())`` where ``main`` opens its handles with
``await backends.open(n)``. Every handle opened is closed at teardown, on that same loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
import pytest

from replicron import Scheduler
from replicron.backends.base import Backend
from replicron.backends.embedded import LEDGER_NAME, EmbeddedBackend
from replicron.backends.memory import MemoryBackend, MemoryState
from replicron.postgres import CoordinationMode, PostgresBackend
from replicron.testing import FakeClock
from tests.helpers import Recorder, fresh_database

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "xfail_backend(*names, reason): strict xfail of a contract test on the named backends "
        "(a known bug of that backend, reported with a reproducer)",
    )


@dataclass(frozen=True)
class Recorded:
    """A tick's recorded outcome as the store keeps it."""

    outcome: str
    replica_id: str
    error: str | None
    manual: bool = False


class Store(Protocol):
    """The state shared by the handles of one backend (what replicas coordinate through)."""

    def new_handle(self) -> Backend:
        """A new, unopened handle on this store."""

    def recorded(self, job: str) -> dict[datetime, Recorded]:
        """Tick -> recorded outcome, for every tick of ``job`` with an outcome."""

    def started(self, job: str) -> set[datetime]:
        """The ticks of ``job`` whose row says when their run started."""


class MemoryStore:
    def __init__(self) -> None:
        self.state = MemoryState()

    def new_handle(self) -> Backend:
        return MemoryBackend(self.state)

    def recorded(self, job: str) -> dict[datetime, Recorded]:
        return {
            r.scheduled_at: Recorded(r.outcome.value, r.replica_id, r.error, r.manual)
            for r in self.state.history(job)
        }

    def started(self, job: str) -> set[datetime]:
        return {r.scheduled_at for r in self.state.history(job) if r.started_at is not None}


class PostgresStore:
    #: The housekeeper (heartbeats, janitor) sleeps this long first: it never runs during a
    #: test, so what a test sees is what its own calls did.
    HEARTBEAT_INTERVAL = 3600.0

    def __init__(self, dsn: str, coordination: CoordinationMode = "advisory") -> None:
        self.dsn = dsn
        self.coordination: CoordinationMode = coordination

    def new_handle(self) -> Backend:
        return PostgresBackend(
            self.dsn, heartbeat_interval=self.HEARTBEAT_INTERVAL, coordination=self.coordination
        )

    def recorded(self, job: str) -> dict[datetime, Recorded]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT scheduled_at, outcome, replica_id, error, manual FROM replicron_runs"
                " WHERE job = %s AND outcome IS NOT NULL",
                [job],
            ).fetchall()
        return {
            tick: Recorded(outcome, replica, error, manual)
            for tick, outcome, replica, error, manual in rows
        }

    def started(self, job: str) -> set[datetime]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "SELECT scheduled_at FROM replicron_runs WHERE job = %s AND started_at IS NOT NULL",
                [job],
            ).fetchall()
        return {tick for (tick,) in rows}


class EmbeddedStore:
    #: As for PostgreSQL: the janitor runs at open (finding nothing) and never again in a test.
    JANITOR_INTERVAL = 3600.0

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def new_handle(self) -> Backend:
        return EmbeddedBackend(self.state_dir, janitor_interval=self.JANITOR_INTERVAL)

    def recorded(self, job: str) -> dict[datetime, Recorded]:
        rows = self._rows(
            "SELECT scheduled_at, outcome, replica_id, error, manual FROM replicron_runs"
            " WHERE job = ? AND outcome IS NOT NULL",
            job,
        )
        return {
            _EPOCH + timedelta(microseconds=tick): Recorded(outcome, replica, error, bool(manual))
            for tick, outcome, replica, error, manual in rows
        }

    def started(self, job: str) -> set[datetime]:
        rows = self._rows(
            "SELECT scheduled_at FROM replicron_runs WHERE job = ? AND started_at IS NOT NULL", job
        )
        return {_EPOCH + timedelta(microseconds=tick) for (tick,) in rows}

    def _rows(self, query: str, job: str) -> list[Any]:
        conn = sqlite3.connect(self.state_dir / LEDGER_NAME)
        try:
            return conn.execute(query, [job]).fetchall()
        finally:
            conn.close()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@contextmanager
def memory_store() -> Iterator[Store]:
    yield MemoryStore()


@contextmanager
def postgres_store() -> Iterator[Store]:
    with fresh_database() as dsn:
        yield PostgresStore(dsn)


@contextmanager
def postgres_lease_store() -> Iterator[Store]:
    with fresh_database() as dsn:
        yield PostgresStore(dsn, coordination="lease")


@contextmanager
def embedded_store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory(prefix="replicron-contract-") as state_dir:
        yield EmbeddedStore(Path(state_dir))


#: Backend name -> a context manager making one store. Add a backend here.
STORES: dict[str, Callable[[], AbstractContextManager[Store]]] = {
    "memory": memory_store,
    "postgres": postgres_store,
    "postgres-lease": postgres_lease_store,
    "embedded": embedded_store,
}


def replica(
    store: Store, n: int, clock: FakeClock, recorder: Recorder, **options: Any
) -> Scheduler:
    """Replica ``r<n>``: a scheduler on its own handle on ``store``, telling ``recorder``."""
    return Scheduler(
        clock=clock, backend=store.new_handle(), replica_id=f"r{n}", listeners=[recorder], **options
    )


class Backends:
    """Handles on one store of one backend, and the event loop that drives them."""

    def __init__(self, name: str, store: Store, runner: asyncio.Runner) -> None:
        self.name = name
        self.store = store
        self._runner = runner
        self._opened: list[Backend] = []
        self._replica_ids: dict[int, str] = {}

    async def open(self, count: int) -> list[Backend]:
        """``count`` new handles on the shared store, opened as ``replica-<n>`` (n counting
        on across calls, so every handle of a test has its own replica id)."""
        handles = []
        for _ in range(count):
            handle = self.store.new_handle()
            replica_id = f"replica-{len(self._opened)}"
            self._opened.append(handle)
            self._replica_ids[id(handle)] = replica_id
            await handle.open(replica_id)
            handles.append(handle)
        return handles

    def replica_id(self, handle: Backend) -> str:
        return self._replica_ids[id(handle)]

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(main)

    def recorded(self, job: str) -> dict[datetime, Recorded]:
        return self.store.recorded(job)

    async def close_all(self) -> None:
        for handle in self._opened:
            await handle.close()


@pytest.fixture(params=list(STORES))
def backends(request: pytest.FixtureRequest) -> Iterator[Backends]:
    name: str = request.param
    for mark in request.node.iter_markers("xfail_backend"):
        if name in mark.args:
            request.applymarker(pytest.mark.xfail(strict=True, reason=mark.kwargs["reason"]))
    with STORES[name]() as store, asyncio.Runner() as runner:
        harness = Backends(name, store, runner)
        try:
            yield harness
        finally:
            runner.run(harness.close_all())
