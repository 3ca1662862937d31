"""A real HTTP server on 127.0.0.1 that records what it is sent: the far end of a notifier."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Answers each request with the next of ``statuses`` (then 200, or a redirect to
    ``location`` when that is a 3xx); while ``hang`` is set, holds every request until it is
    cleared or the server closes."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.statuses: list[int] = []
        self.location = ""
        self.hang = threading.Event()
        self._released = threading.Event()
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with receiver._cond:
                    receiver.received.append(
                        Received(self.command, self.path, dict(self.headers), body)
                    )
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver._cond.notify_all()
                while receiver.hang.is_set() and not receiver._released.wait(0.05):
                    pass
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        """The first ``count`` requests, once that many came (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.received)} requests came, not {count}"
                self._cond.wait(left)
            return list(self.received[:count])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()


@contextmanager
def dripping(seconds_per_byte: float = 0.05) -> Iterator[str]:
    """The URL of an endpoint that answers every request one byte at a time, for ever: each
    read gets a byte well within any timeout, and the answer never ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    closed = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            answer = b"HTTP/1.1 200 OK\r\nX-Padding: "
            try:
                for byte in answer:
                    conn.sendall(bytes([byte]))
                while not closed.wait(seconds_per_byte):
                    conn.sendall(b"x")
            except OSError:
                pass

    def accept() -> None:
        while not closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    finally:
        closed.set()
        listener.close()
