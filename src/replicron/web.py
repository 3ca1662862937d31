"""A read-only status page of the cluster, as a plain ASGI 3 application.

:func:`status_app` needs no web framework: mount it in an existing app, e.g. FastAPI's
``app.mount("/jobs", status_app(backend))``, or serve it with any ASGI server
(``uvicorn.run(status_app(backend))``). Routes, relative to where it is mounted:

* ``GET /``: the page, rendered on the server; it reloads itself every ``refresh`` seconds.
* ``GET /status.json``: :meth:`ClusterStatus.to_json`, with any password in error text masked.

``HEAD`` is answered like ``GET`` without the body; other methods get 405, other paths 404.
When the status cannot be read, both routes answer 503 with the error's first line (any
password in it masked), and the page keeps refreshing until the read succeeds.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol, cast

from ._web import error_page, status_page
from .cluster import ClusterStatus, StatusSource
from .dsn import mask_dsn
from .errors import ArgumentTypeError, ConfigurationError

__all__ = ["status_app"]

logger = logging.getLogger(__name__)

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

#: A read that takes longer is answered 503: a page that hangs tells an operator less than
#: one that says the backend does not answer (and each refresh would pile up another read).
_READ_TIMEOUT = 15.0
#: Seconds a status read serves the requests that follow it.
_FRESH = 2.0

_HTML = "text/html; charset=utf-8"
_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"
# The page needs nothing but its own inline style and icon: forbid everything else, so that
# even text that slipped past escaping could not run or load anything.
_SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
        b"form-action 'none'; frame-ancestors 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)
_ROUTES = ("/", "/status.json")


class _BlockingSource(Protocol):
    def cluster_status(self) -> ClusterStatus: ...


def status_app(
    source: StatusSource | _BlockingSource, *, refresh: float = 10.0, title: str = "replicron"
) -> _App:
    """An ASGI 3 app showing ``source.cluster_status()``, read at most every two seconds
    however many pages are open.

    ``source``: a backend shared by replicas (``PostgresBackend``, ``EmbeddedBackend``), an
    ``AsyncScheduler``, or anything with a ``cluster_status()`` coroutine method; a threaded
    ``Scheduler`` too, whose blocking read then runs on a worker thread.

    ``refresh``: seconds between the page's reloads (whole seconds in the browser, at least
    one). ``title``: the page's heading and the browser tab's title.
    """
    if not isinstance(source, StatusSource):  # a threaded Scheduler's blocking one too
        raise ArgumentTypeError(
            f"status_app needs a source with an async cluster_status() method (a shared "
            f"backend), got {type(source).__name__}"
        )
    if isinstance(refresh, bool) or not isinstance(refresh, int | float):
        raise ArgumentTypeError(f"refresh must be a number of seconds, got {refresh!r}")
    if not math.isfinite(refresh) or refresh <= 0:
        raise ConfigurationError(f"refresh must be a positive number of seconds, got {refresh}")
    if not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    return _StatusApp(source, float(refresh), title)


class _StatusApp:
    def __init__(self, source: StatusSource | _BlockingSource, refresh: float, title: str) -> None:
        self._source = source
        self._refresh = refresh
        self._title = title
        self._kept: tuple[float, ClusterStatus] | None = None  # (monotonic time, status)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1000})

    async def _http(self, scope: _Scope, send: _Send) -> None:
        base = str(scope.get("root_path", "")).rstrip("/")
        path = _route(str(scope["path"]), base)
        method = str(scope["method"]).upper()
        head = method == "HEAD"
        if path not in _ROUTES:
            await _respond(send, 404, _TEXT, b"Not Found\n", head=head)
            return
        if method not in ("GET", "HEAD"):
            await _respond(send, 405, _TEXT, b"Method Not Allowed\n", head=head, allow=b"GET, HEAD")
            return
        status, failure = await self._read()
        if path == "/status.json":
            if status is None:
                payload: dict[str, Any] = {"error": failure}
            else:
                payload = _masked_json(status)
            body = json.dumps(payload, indent=2).encode() + b"\n"
            await _respond(send, 503 if status is None else 200, _JSON, body, head=head)
            return
        if status is None:
            page = error_page(failure, title=self._title, refresh=self._refresh, base=base)
            await _respond(send, 503, _HTML, page.encode(), head=head)
            return
        page = status_page(status, title=self._title, refresh=self._refresh, base=base)
        await _respond(send, 200, _HTML, page.encode(), head=head)

    async def _read(self) -> tuple[ClusterStatus | None, str]:
        """The status, or None and why it could not be read (one line, passwords masked).
        A read younger than ``_FRESH`` serves again: many open pages, one database read."""
        kept = self._kept
        if kept is not None and time.monotonic() - kept[0] < _FRESH:
            return kept[1], ""
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                status = await self._call_source()
                self._kept = (time.monotonic(), status)
                return status, ""
        except TimeoutError:
            failure = f"reading the cluster's status took longer than {_READ_TIMEOUT:g} s"
        except Exception as exc:
            failure = _one_line(exc)
        logger.warning("status page: cannot read the cluster's status: %s", failure)
        return None, failure

    async def _call_source(self) -> ClusterStatus:
        read: Callable[[], Any] = self._source.cluster_status
        if inspect.iscoroutinefunction(read):
            status: ClusterStatus = await read()
            return status
        # A blocking read (the threaded Scheduler's) must not stall the server's event loop.
        result = await asyncio.to_thread(read)
        if inspect.isawaitable(result):
            result = await result
        return cast(ClusterStatus, result)


def _route(path: str, base: str) -> str:
    """``path`` relative to the mount point. Servers and frameworks differ on whether the
    path they pass still starts with ``root_path`` (Starlette's Mount keeps it, uvicorn's
    ``--root-path`` prepends it, older ones strip it): both are accepted."""
    if base and (path == base or path.startswith(base + "/")):
        path = path[len(base) :]
    return path or "/"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    name = type(exc).__name__
    return mask_dsn(f"{name}: {first}" if first else name)


def _masked_json(status: ClusterStatus) -> dict[str, Any]:
    data = status.to_json()
    for job in data["jobs"]:
        if job["last_error"] is not None:
            job["last_error"] = mask_dsn(job["last_error"])
    data["problems"] = [mask_dsn(line) for line in data["problems"]]
    return data


async def _respond(
    send: _Send,
    code: int,
    content_type: str,
    body: bytes,
    *,
    head: bool,
    allow: bytes | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *_SECURITY_HEADERS,
    ]
    if allow is not None:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def _lifespan(receive: _Receive, send: _Send) -> None:
    # Nothing to set up or tear down: the source belongs to the caller.
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
