"""Running a Django project's scheduler: as a process of its own (``manage.py replicron
run``), or inside the web server's processes, opted in with ``run_in_web_process`` (on the
first request a process serves) or the ASGI :class:`ReplicronLifespan` wrapper (at the
server's lifespan startup).

In a web process it never starts under a management command other than ``runserver``'s
serving child (``migrate``, ``shell``, ``test``, the autoreloader's parent ...), under pytest,
or on a mere import: only a process that serves requests runs jobs.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from replicron.scheduler import Scheduler

from .conf import read_settings
from .declare import build_scheduler

__all__ = [
    "ReplicronLifespan",
    "run_until_signalled",
    "start_in_this_process",
    "web_process_refusal",
]

_logger = logging.getLogger("replicron")
_MANAGE = ("manage.py", "django-admin", "django-admin.py")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def run_until_signalled(scheduler: Scheduler) -> int:
    """Run ``scheduler`` until SIGTERM or SIGINT, then stop it as the daemon does: claim no
    more, let runs finish within its ``stop_timeout``, release every lock. Exit status 0."""
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    scheduler.start()
    jobs = ", ".join(job.name for job in scheduler.jobs()) or "none"
    _logger.info("replica %s runs jobs: %s", scheduler.replica_id, jobs)
    while not stop.wait(3600):
        pass
    _logger.info(
        "%s: stopping (runs under way get up to %g s)",
        signal.Signals(received[0]).name,
        scheduler.stop_timeout,
    )
    scheduler.shutdown(wait=True)
    _logger.info("stopped")
    return 0


def web_process_refusal(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why this process must not run the scheduler in the web process, or None when it may:
    it is no management command other than ``runserver`` (and then only the autoreloader's
    child, which serves), and no test run."""
    program = os.path.basename(argv[0]) if argv else ""
    if program in _MANAGE or argv[0].endswith(os.path.join("django", "__main__.py")):
        command = argv[1] if len(argv) > 1 else ""
        if command != "runserver":
            return f"a management command ({command or 'none'})"
        if environ.get("RUN_MAIN") != "true" and "--noreload" not in argv:
            return "runserver's autoreloader parent (its child serves)"
        return None
    if "pytest" in program or "PYTEST_CURRENT_TEST" in environ:
        return "a test run"
    return None


_started: Scheduler | None = None
_start_lock = threading.Lock()


def start_in_this_process() -> Scheduler | None:
    """The web process's scheduler, started once (None where :func:`web_process_refusal`
    says no); stopped at exit."""
    global _started
    with _start_lock:
        if _started is not None:
            return _started
        why_not = web_process_refusal(sys.argv, os.environ)
        if why_not is not None:
            _logger.debug("replicron does not run in this process: %s", why_not)
            return None
        scheduler = build_scheduler(read_settings())
        scheduler.start()
        atexit.register(scheduler.shutdown)
        _started = scheduler
        return scheduler


def stop_in_this_process() -> None:
    global _started
    with _start_lock:
        scheduler, _started = _started, None
    if scheduler is not None:
        scheduler.shutdown(wait=True)


class ReplicronLifespan:
    """An ASGI app that runs the project's scheduler for the server's lifetime: started at
    the lifespan's startup (the guard of :func:`web_process_refusal` applies), stopped
    gracefully at its shutdown. Everything else goes to ``app``::

        application = ReplicronLifespan(get_asgi_application())
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        import asyncio

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(start_in_this_process)
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(stop_in_this_process)
                await send({"type": "lifespan.shutdown.complete"})
                return
