"""Virtual time for a set of simulated processes, each with an event loop of its own.

Nothing here sleeps or waits on a socket: the world keeps one clock, a queue of events for
the server and the network, and the processes' event loops, and runs whichever is due first,
one step at a time. A frozen process is not stepped; a killed one never again. The time
sources the code under test reads (``time.monotonic``, ``time.time``, the system clock's
``datetime.now``) read the world's clock, ``time.time`` shifted by the stepping process's own
clock offset; uuids, pids and the ``random`` module come from the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import random
import selectors
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, tzinfo
from typing import Any
from unittest import mock

import replicron.clock
from replicron._engine import sync_runs

__all__ = ["Process", "World"]


class _NoWaitSelector(selectors.SelectSelector):
    """A selector that never waits: the world moves the time, not the loop."""

    def select(self, timeout: float | None = None) -> list[Any]:
        return []


class _StepPool:
    """The engine's worker threads as steps of the process's own loop: each run handed over
    is a callback, run when the world steps that process (a thread's real timing would make
    a trace depend on the machine)."""

    def __init__(self, size: int, name: str, handler: Callable[[Any], None]) -> None:
        self.size = size
        self._handler = handler
        self.run_seconds: float | None = None
        self.waiting = 0

    def submit_many(self, items: Any) -> None:
        loop = asyncio.get_running_loop()
        for item in items:
            loop.call_soon(self._handler, item)

    def supervise(self) -> bool:
        return False

    def stop(self, timeout: float | None) -> list[Any]:
        return []


async def _inline(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``asyncio.to_thread``, on the calling process's own step."""
    return func(*args, **kwargs)


class Process:
    """A simulated process: an event loop of its own, a pid, a clock offset."""

    def __init__(self, world: World, name: str, pid: int, offset: float) -> None:
        self.world = world
        self.name = name
        self.pid = pid
        self.offset = offset
        self.loop = asyncio.SelectorEventLoop(_NoWaitSelector())
        self.frozen_until: float | None = None
        self.dead = False

    def step(self) -> None:
        loop: Any = self.loop
        asyncio.events._set_running_loop(self.loop)
        try:
            loop._run_once()
        finally:
            asyncio.events._set_running_loop(None)

    def end(self) -> None:
        """The simulation is over: what still runs here is cancelled and closed, quietly."""
        self.dead = True
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        loop: Any = self.loop
        for _ in range(100):
            if not loop._ready:
                break
            self.step()
        self.loop.close()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self.loop.create_task(coro)


class World:
    """One clock, the events of the server and the network, and the processes."""

    def __init__(self, seed: int, start: datetime) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0  # monotonic seconds
        self._epoch = start.timestamp()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.processes: list[Process] = []
        self._living: list[Process] = []
        self.current: Process | None = None
        self._pids = 4000

    # ---- time --------------------------------------------------------------------------

    def monotonic(self) -> float:
        return self.now

    def wall(self, process: Process | None = None) -> float:
        """Unix time as ``process`` (the stepping one by default) reads it."""
        process = process if process is not None else self.current
        return self._epoch + self.now + (process.offset if process is not None else 0.0)

    def instant(self, at: float | None = None) -> datetime:
        """The true instant (UTC) of monotonic ``at`` (now by default)."""
        return datetime.fromtimestamp(self._epoch + (self.now if at is None else at), UTC)

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """A server or network event at monotonic ``when``."""
        self._seq += 1
        heapq.heappush(self._events, (max(when, self.now), self._seq, callback))

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.call_at(self.now + delay, callback)

    # ---- processes -----------------------------------------------------------------------

    def process(self, name: str, offset: float = 0.0) -> Process:
        self._pids += 1 + self.rng.randrange(7)
        process = Process(self, name, self._pids, offset)
        self.processes.append(process)
        self._living.append(process)
        return process

    def run_until(self, end: float, after_each: Callable[[], None]) -> None:
        """Run events and processes in time order until monotonic ``end``: the earliest due
        first; an event before a process due at the same instant, and processes in the order
        they were started."""
        events = self._events
        while True:
            when, process = self._next_process()
            if events and (when is None or events[0][0] <= when):
                when, process = events[0][0], None
            if when is None or when > end:
                self.now = max(self.now, end)
                return
            if when > self.now:
                self.now = when
            if process is None:
                heapq.heappop(events)[2]()
            else:
                self.current = process
                try:
                    process.step()
                finally:
                    self.current = None
            after_each()

    def _next_process(self) -> tuple[float | None, Process | None]:
        """The living process that has something to do first, and when. A frozen process
        does nothing until it is thawed, then whatever fell due meanwhile. (This runs before
        every step, hence the loop's internals read in place.)"""
        now = self.now
        best: float | None = None
        chosen: Process | None = None
        pruned = False
        for process in self._living:
            if process.dead:
                pruned = True
                continue
            loop: Any = process.loop
            if loop._ready:
                due = now
            else:
                scheduled = loop._scheduled
                while scheduled and scheduled[0]._cancelled:
                    heapq.heappop(scheduled)._scheduled = False
                if not scheduled:
                    continue
                due = scheduled[0]._when
                if due < now:
                    due = now
            frozen = process.frozen_until
            if frozen is not None and frozen > due:
                due = frozen
            if best is None or due < best:
                best, chosen = due, process
        if pruned:
            self._living = [process for process in self._living if not process.dead]
        return best, chosen

    # ---- what the code under test reads --------------------------------------------------

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)

    def getpid(self) -> int:
        return self.current.pid if self.current is not None else 1

    def sleep(self, seconds: float) -> None:
        """A blocking sleep in a process: the whole process waits (the others are late)."""
        self.now += max(0.0, seconds)

    @contextlib.contextmanager
    def installed(self, seed: int) -> Iterator[None]:
        """Every time source, id and pid the code reads, from this world."""
        world = self

        class _Datetime(datetime):
            @classmethod
            def now(cls, tz: tzinfo | None = None) -> Any:
                return datetime.fromtimestamp(world.wall(), tz)

        state = random.getstate()
        random.seed(seed)
        patches: list[Any] = [
            mock.patch.object(time, "monotonic", world.monotonic),
            mock.patch.object(time, "time", world.wall),
            mock.patch.object(time, "sleep", world.sleep),
            mock.patch.object(replicron.clock, "datetime", _Datetime),
            mock.patch.object(uuid, "uuid4", world.uuid4),
            mock.patch.object(os, "getpid", world.getpid),
            mock.patch.object(socket, "gethostname", return_value="sim"),
            mock.patch.object(sync_runs, "WorkerPool", _StepPool),
            mock.patch.object(asyncio, "to_thread", _inline),
        ]
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            try:
                yield
            finally:
                random.setstate(state)
