"""The daemon's small HTTP server: endpoints, the ASGI fallback, and what it refuses."""

from __future__ import annotations

import asyncio
from typing import Any

from replicron.daemon._http import Response, serve


async def _ok() -> Response:
    return 200, "text/plain", b"fine\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    status = 200 if scope["path"] == "/" else 404
    body = f"{scope['method']} {scope['path']}?{scope['query_string'].decode()}".encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"x-app", b"yes")]})
    await send({"type": "http.response.body", "body": body})


async def _exchange(request: bytes) -> bytes:
    server = await serve("127.0.0.1", 0, {"/healthz": _ok}, _app)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer
    finally:
        server.close()
        await server.wait_closed()


def _split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_an_endpoint_answers_with_its_response_and_a_length() -> None:
    status, headers, body = _split(asyncio.run(_exchange(b"GET /healthz HTTP/1.1\r\n\r\n")))
    assert status == "HTTP/1.1 200 OK"
    assert body == b"fine\n"
    assert headers["content-length"] == str(len(body))
    assert headers["connection"] == "close"


def test_head_sends_the_length_but_no_body() -> None:
    status, headers, body = _split(asyncio.run(_exchange(b"HEAD /healthz HTTP/1.1\r\n\r\n")))
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-length"] == "5"
    assert body == b""


def test_other_paths_go_to_the_asgi_app_with_their_query() -> None:
    request = b"GET /?a=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    status, headers, body = _split(asyncio.run(_exchange(request)))
    assert status == "HTTP/1.1 200 OK"
    assert headers["x-app"] == "yes"
    assert body == b"GET /?a=1"
    status, _, _ = _split(asyncio.run(_exchange(b"GET /nowhere HTTP/1.1\r\n\r\n")))
    assert status.startswith("HTTP/1.1 404")


def test_methods_other_than_get_and_head_are_refused() -> None:
    status, _, body = _split(asyncio.run(_exchange(b"POST /healthz HTTP/1.1\r\n\r\n")))
    assert status.startswith("HTTP/1.1 405")
    assert b"GET" in body


def test_a_malformed_request_line_is_a_bad_request() -> None:
    status, _, _ = _split(asyncio.run(_exchange(b"NONSENSE\r\n\r\n")))
    assert status.startswith("HTTP/1.1 400")


def test_an_endless_request_head_is_cut_off() -> None:
    request = b"GET /healthz HTTP/1.1\r\n" + b"x-long: " + b"a" * 200_000 + b"\r\n\r\n"
    status, _, _ = _split(asyncio.run(_exchange(request)))
    assert status.startswith("HTTP/1.1 400")
