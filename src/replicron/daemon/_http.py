"""The daemon's HTTP endpoint on its own event loop: ``/healthz``, ``/readyz``, ``/metrics``,
and the status page (``/``, ``/status.json``, an ASGI app driven here). GET and HEAD only,
one request per connection, small bounded reads: it is for probes and scrapes, not the world.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = ["Endpoint", "Response", "serve"]

logger = logging.getLogger("replicron.daemon")

Response = tuple[int, str, bytes]  # status, content type, body
Endpoint = Callable[[], Awaitable[Response]]
App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    400: "Bad Request",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_MAX_HEAD = 16384
_READ_TIMEOUT = 10.0


def json_response(status: int, body: dict[str, Any]) -> Response:
    return status, "application/json", (json.dumps(body, indent=1) + "\n").encode()


async def serve(
    host: str, port: int, endpoints: Mapping[str, Endpoint], fallback: App
) -> asyncio.Server:
    """Listen on ``host:port``: paths in ``endpoints`` answer from their function, others from
    the ASGI app ``fallback``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await _handle(reader, writer, endpoints, fallback, (host, port))
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("HTTP request failed", extra={"event": "http_error"})
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, reuse_address=True)


async def _handle(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    endpoints: Mapping[str, Endpoint],
    fallback: App,
    server: tuple[str, int],
) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
    except asyncio.LimitOverrunError:
        await _write(writer, (400, "text/plain", b"request head too large\n"), "GET")
        return
    if len(head) > _MAX_HEAD:
        await _write(writer, (400, "text/plain", b"request head too large\n"), "GET")
        return
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        await _write(writer, (400, "text/plain", b"bad request line\n"), "GET")
        return
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        await _write(writer, (405, "text/plain", b"only GET and HEAD\n"), method)
        return
    path, _, query = target.partition("?")
    endpoint = endpoints.get(path)
    if endpoint is not None:
        await _write(writer, await endpoint(), method)
        return
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers.append(
                (name.strip().lower().encode("latin-1"), value.strip().encode("latin-1"))
            )
    await _asgi(fallback, writer, method, path, query, headers, server)


async def _asgi(
    app: App,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    query: str,
    headers: list[tuple[bytes, bytes]],
    server: tuple[str, int],
) -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("latin-1"),
        "root_path": "",
        "query_string": query.encode("latin-1"),
        "headers": headers,
        "server": server,
        "client": writer.get_extra_info("peername"),
    }
    answer: dict[str, Any] = {"status": 500, "headers": [], "body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"], answer["headers"] = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    sent = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in answer["headers"]
        if name.lower() not in (b"content-length", b"connection")
    ]
    await _send(writer, answer["status"], sent, answer["body"], method)


async def _write(writer: asyncio.StreamWriter, response: Response, method: str) -> None:
    status, content_type, body = response
    headers = [("content-type", content_type), ("cache-control", "no-store")]
    await _send(writer, status, headers, body, method)


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    method: str,
) -> None:
    """One response and the end of the connection; a HEAD's has the length but no body."""
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}"]
    head += [f"{name}: {value}" for name, value in headers]
    head += [f"content-length: {len(body)}", "connection: close", "", ""]
    writer.write("\r\n".join(head).encode("latin-1") + (b"" if method == "HEAD" else body))
    await writer.drain()
