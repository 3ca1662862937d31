"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from replicron import (
    EmbeddedBackend,
    Listener,
    MemoryBackend,
    Outcome,
    RunEvent,
    Scheduler,
    current_run,
    every,
)
from replicron.backends.base import Claim, ClaimRequest, RunRecord
from replicron.backends.embedded import LEDGER_NAME
from replicron.cluster import ClusterStatus
from replicron.testing import FakeClock

T = TypeVar("T")


def poll_until(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    every: float = 0.05,
    before_each: Callable[[], None] | None = None,
) -> T:
    """For real-time tests of processes: poll ``check`` until it returns something other
    than None/False (``before_each`` may fail first, e.g. on a process that died); fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if before_each is not None:
            before_each()
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def brute(
    pred: Callable[[datetime], bool],
    after: datetime,
    count: int,
    step: timedelta,
    limit: int = 20_000,
) -> list[datetime]:
    """The reference oracle of the cron tests: the first ``count`` instants
    ``after + k * step`` (k >= 1) that satisfy ``pred``."""
    found: list[datetime] = []
    current = after
    for _ in range(limit):
        current += step
        if pred(current):
            found.append(current)
            if len(found) == count:
                return found
    raise AssertionError(f"reference found only {len(found)} fire times within the limit")


def summary_recorder(lines: list[str]) -> Callable[[str], None]:
    """A scenario's summary line: printed now (captured with the test) and kept in ``lines``
    for the end of the run."""

    def add(line: str) -> None:
        print(line)
        lines.append(line)

    return add


def z(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    microsecond: int = 0,
) -> datetime:
    """An instant in UTC, written as its calendar fields (the way expectations read best)."""
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


#: Where the unit tests' fake clocks start.
START = z(2026, 1, 1)


def noop() -> None:
    """A task that does nothing."""


def step(clock: FakeClock, to: datetime) -> None:
    """Wait until the engine sleeps, then move the clock to ``to``."""
    assert clock.wait_for_sleepers(1)
    clock.set(to)


class Recorder(Listener):
    """A listener that keeps every event and lets a test wait for some, without sleeping."""

    HOOKS = (
        "before_run",
        "after_success",
        "after_failure",
        "on_timeout",
        "on_skipped",
        "on_missed",
        "on_abandoned",
        "on_lock_error",
    )

    def __init__(self) -> None:
        self.events: list[tuple[str, RunEvent]] = []
        self._cond = threading.Condition()
        self._async_waiters: list[
            tuple[Callable[[], bool], asyncio.AbstractEventLoop, asyncio.Future[None]]
        ] = []
        for hook in self.HOOKS:
            setattr(self, hook, functools.partial(self._record, hook))

    def _record(self, hook: str, event: RunEvent) -> None:
        with self._cond:
            self.events.append((hook, event))
            self._cond.notify_all()
            ready = [w for w in self._async_waiters if w[0]()]
            self._async_waiters = [w for w in self._async_waiters if w not in ready]
        for _, loop, future in ready:
            loop.call_soon_threadsafe(_set_done, future)

    def of(self, hook: str, job: str | None = None) -> list[RunEvent]:
        with self._cond:
            return [e for h, e in self.events if h == hook and (job is None or e.job == job)]

    def outcomes(self, job: str | None = None) -> list[tuple[datetime, Outcome]]:
        """(tick, outcome) of every tick's outcome, in the order they were reported."""
        with self._cond:
            return [
                (e.scheduled_at, e.outcome)
                for _, e in self.events
                if e.outcome is not None and (job is None or e.job == job)
            ]

    def wait(self, predicate: Callable[[Recorder], bool], timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(f"timed out waiting; events so far: {self.events}")

    def wait_count(self, hook: str, count: int, job: str | None = None) -> list[RunEvent]:
        self.wait(lambda r: len(r.of(hook, job)) >= count)
        return self.of(hook, job)

    async def await_count(self, hook: str, count: int, job: str | None = None) -> list[RunEvent]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if len(self.of(hook, job)) >= count:
                return self.of(hook, job)
            self._async_waiters.append((lambda: len(self.of(hook, job)) >= count, loop, future))
        await asyncio.wait_for(future, 10)
        return self.of(hook, job)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def assert_no_tasks_left() -> None:
    """No asyncio task but the caller's is left on the running loop."""
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not left, f"tasks left running: {left}"


def server_dsn() -> str:
    """The PostgreSQL server tests may use (REPLICRON_TEST_DSN); skips the test without one."""
    import os

    import pytest

    dsn = os.environ.get("REPLICRON_TEST_DSN")
    if not dsn:
        pytest.skip("REPLICRON_TEST_DSN is not set")
    return dsn


@contextlib.contextmanager
def fresh_database(prefix: str = "replicron_test") -> Iterator[str]:
    """A new, empty database on the test server, dropped with its sessions afterwards;
    yields its DSN."""
    import uuid

    import psycopg
    from psycopg.conninfo import make_conninfo

    server = server_dsn()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


REPO = Path(__file__).resolve().parents[1]
#: The columns of the embedded ledger that hold instants, as microseconds since the epoch.
_INSTANTS = ("scheduled_at", "claimed_at", "started_at", "finished_at")


def embedded_rows(state_dir: Path, job: str) -> list[dict[str, Any]]:
    """The rows of ``job`` in the ledger of an embedded state directory, by tick, with the
    instants as datetimes (UTC); none while the ledger or its table does not exist yet."""
    path = state_dir / LEDGER_NAME
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT * FROM replicron_runs WHERE job = ? ORDER BY scheduled_at", [job]
        ).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return [
        {
            key: epoch + timedelta(microseconds=value)
            if key in _INSTANTS and value is not None
            else value
            for key, value in dict(row).items()
        }
        for row in rows
    ]


def ran_once_then_down(
    state_dir: Path, start: datetime, down: timedelta, job: str = "fast"
) -> tuple[FakeClock, datetime]:
    """A per-second ``job`` on an embedded ledger ran its first tick after ``start``, then no
    replica was up for ``down``: the clock, now at the end of that, and the first tick."""
    clock = FakeClock(start)
    first_tick = clock.now() + timedelta(seconds=1)
    with Scheduler(clock=clock, backend=EmbeddedBackend(state_dir)) as first:
        ran = Recorder()
        first.add_listener(ran)
        first.add_job(every(seconds=1), noop, name=job)
        step(clock, first_tick)
        ran.wait_count("after_success", 1)
    clock.set(first_tick + down)  # the ticks after the first fell due meanwhile
    return clock, first_tick


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``replicron ARGS`` as a real process, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "replicron", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class FlakyBackend(MemoryBackend):
    """The in-process backend with its first claims and miss records failing (one of each
    unless told), and its cluster reads while ``reads_fail`` is set, as a network backend's
    would when its connection drops."""

    def __init__(self, *, fail_claims: int = 1, fail_records: int = 1) -> None:
        super().__init__()
        self.fail_claims, self.fail_records = fail_claims, fail_records
        self.reads_fail = False

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        if self.fail_claims:
            self.fail_claims -= 1
            raise ConnectionError("backend unreachable")
        return await super().claim(requests)

    async def record_unclaimed(self, records: Sequence[RunRecord]) -> list[int | None]:
        if self.fail_records:
            self.fail_records -= 1
            raise ConnectionError("backend unreachable")
        return await super().record_unclaimed(records)

    async def cluster_status(self) -> ClusterStatus:
        if self.reads_fail:
            raise ConnectionError("backend unreachable")
        return await super().cluster_status()


class Gate:
    """A task that blocks until released, and counts how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.started: list[datetime] = []
        self.entered = threading.Condition(self.lock)

    def __call__(self) -> None:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.started.append(current_run().scheduled_at)
            self.entered.notify_all()
        self.release.wait(10)
        with self.lock:
            self.running -= 1

    def wait_started(self, count: int) -> None:
        with self.lock:
            assert self.entered.wait_for(lambda: len(self.started) >= count, 10)


class Stepped:
    """A task whose every run blocks until the test lets it end (``finish.set()``, re-armed
    by the run), so that a FakeClock test sets each run's finish; what ran: (replica, tick),
    and how many ran at once at most. ``fail``: runs raise once let go."""

    def __init__(self) -> None:
        self.finish = threading.Event()
        self.ran: list[tuple[str, datetime]] = []
        self.running = 0
        self.most_at_once = 0
        self.fail = False
        self._cond = threading.Condition()

    def __call__(self) -> None:
        run = current_run()
        with self._cond:
            self.ran.append((run.replica_id, run.scheduled_at))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self._cond.notify_all()
        self.finish.wait(30)
        self.finish.clear()
        with self._cond:
            self.running -= 1
        if self.fail:
            raise RuntimeError("the task failed")

    def wait_started(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.ran) >= count, 30), self.ran

    def ticks(self) -> list[datetime]:
        return [tick for _, tick in self.ran]
