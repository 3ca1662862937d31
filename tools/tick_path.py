"""The modules one tick passes, from the engine's wake-up to its committed outcome.

    REPLICRON_TEST_DSN=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python tools/tick_path.py
    ... tools/tick_path.py --coordination lease   # row-lease mode
    ... tools/tick_path.py --functions            # each function, in order of its first call

An ``AsyncScheduler`` on ``PostgresBackend(dsn)`` (advisory unless ``--coordination lease``)
runs one sync job every second. A profiler records every call of a function defined in the
``replicron`` package that is imported (coroutine resumes included), on every thread. The
window of a tick opens as ``Engine._sleep`` returns before the ``Engine._step`` that claims
it, and closes as the recorder hands the finished run back to the dispatcher
(``Dispatcher.after_release``), once ``PostgresBackend.release`` has written its outcome and
unlocked its job. Printed: the modules with at least one function run in that window, in
order of first entry, each with the first functions run there. The second claiming step is
measured (the first may still be warming up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import types
import uuid
from typing import Any, NamedTuple

import replicron
from replicron import AsyncScheduler, every
from replicron.postgres import PostgresBackend

PACKAGE = os.path.dirname(replicron.__file__)


class Call(NamedTuple):
    thread: str
    event: str
    module: str
    function: str


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.on = False

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "return"):
            return
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE):
            module = code.co_filename[len(PACKAGE) + 1 :]
            thread = threading.current_thread().name
            self.calls.append(Call(thread, event, module, code.co_qualname))


def task() -> None:
    """The job: nothing, so that the path is the scheduler's."""


async def record(dsn: str, coordination: str, recorder: Recorder) -> None:
    namespace = f"tickpath-{uuid.uuid4().hex[:8]}/"
    backend = PostgresBackend(dsn, namespace=namespace, coordination=coordination)  # type: ignore[arg-type]
    scheduler = AsyncScheduler(backend=backend)
    scheduler.add_job(every(seconds=1), task, name="tick")
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        async with scheduler:
            await asyncio.sleep(1.5)
            recorder.on = True
            await asyncio.sleep(3.2)
            recorder.on = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def tick_window(calls: list[Call], which: int) -> list[Call]:
    steps = [n for n, c in enumerate(calls) if c.event == "call" and c.function == "Engine._step"]
    claiming = [
        start
        for start, end in zip(steps, [*steps[1:], len(calls)], strict=True)
        if any(c.function == "PostgresBackend.claim" for c in calls[start:end])
    ]
    start = claiming[which]
    end = next(
        n for n in range(start, len(calls)) if calls[n].function == "Dispatcher.after_release"
    )
    woke = max(
        n
        for n in range(start)
        if calls[n].function == "Engine._sleep" and calls[n].event == "return"
    )
    return calls[woke:end]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordination", default="advisory", choices=["advisory", "lease"])
    parser.add_argument("--functions", action="store_true", help="list every function")
    args = parser.parse_args()
    recorder = Recorder()
    started = time.monotonic()
    asyncio.run(record(os.environ["REPLICRON_TEST_DSN"], args.coordination, recorder))
    window = tick_window(recorder.calls, 1)
    functions: dict[tuple[str, str], str] = {}
    for call in window:
        if call.event == "call":
            functions.setdefault((call.module, call.function), call.thread)
    modules: dict[str, list[str]] = {}
    for module, function in functions:
        modules.setdefault(module, []).append(function)
    if args.functions:
        for (module, function), thread in functions.items():
            print(f"{thread:28} {module:36} {function}")
    print(
        f"{args.coordination}: {len(modules)} modules, {len(functions)} functions on a tick's "
        f"path (recorded in {time.monotonic() - started:.1f} s)"
    )
    for number, (module, names) in enumerate(modules.items(), 1):
        more = " ..." if len(names) > 4 else ""
        print(f"{number:3}  {module}: {', '.join(names[:4])}{more}")


if __name__ == "__main__":
    main()
