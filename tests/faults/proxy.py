"""A userspace TCP proxy that can slow every byte down, or stop forwarding while keeping every
socket open.

It stands for the load balancers, sidecars and NAT boxes between a replica and PostgreSQL:
when one of them hangs, neither end sees a FIN, an RST or even a missing ACK (the proxy's
kernel acknowledges everything), so TCP keepalives and ``tcp_user_timeout`` notice nothing.
Given a ``delay``, it holds what it reads that long before passing it on, each way: a slow
link, whose round trip is twice the delay longer.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque

__all__ = ["HangingProxy"]

#: How long the proxy's loop sleeps at most between looks at its sockets (seconds).
_TICK = 0.05


class HangingProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; ``delay`` (seconds, settable at any time)
    holds each chunk that long before it is passed on; :meth:`hang` stops moving bytes
    (sockets stay open, new connections are accepted and left alone), :meth:`close` ends it
    all."""

    def __init__(self, target: tuple[str, int], *, delay: float = 0.0) -> None:
        self.target = target
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._sockets: list[socket.socket] = [self._listener]
        # What was read and is not passed on yet, per receiving socket: (when due, bytes);
        # empty bytes close the pair once everything before them went out.
        self._pending: dict[socket.socket, deque[tuple[float, bytes]]] = {}
        self._hung = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hanging-proxy", daemon=True)
        self._thread.start()

    def dsn(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def hang(self) -> None:
        self._hung.set()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            for key, _ in self._selector.select(timeout=self._next_wait()):
                if key.data is None:
                    self._accept()
                elif not self._hung.is_set():
                    self._read(key.fileobj, key.data)  # type: ignore[arg-type]
            if self._hung.is_set():
                # Keep everything open, read nothing: the peers' data sits in the buffers.
                for key in list(self._selector.get_map().values()):
                    if key.data is not None:
                        self._selector.unregister(key.fileobj)
                self._pending.clear()
            else:
                self._pass_on_due()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        self._sockets.append(client)
        if self._hung.is_set():
            return  # accepted by the kernel already; left alone
        upstream = socket.create_connection(self.target)
        self._sockets.append(upstream)
        self._selector.register(client, selectors.EVENT_READ, upstream)
        self._selector.register(upstream, selectors.EVENT_READ, client)

    def _read(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        if not data:  # read nothing more from either; close once the rest went out
            for sock in (source, sink):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
        self._pending.setdefault(sink, deque()).append((time.monotonic() + self.delay, data))
        if not data:
            self._pending.setdefault(source, deque()).append((0.0, b""))

    def _pass_on_due(self) -> None:
        now = time.monotonic()
        for sink, queue in list(self._pending.items()):
            while queue and queue[0][0] <= now:
                _, data = queue.popleft()
                if not data:
                    self._pending.pop(sink, None)
                    with contextlib.suppress(OSError):
                        sink.close()
                    break
                with contextlib.suppress(OSError):
                    sink.sendall(data)
            if not queue:
                self._pending.pop(sink, None)

    def _next_wait(self) -> float:
        """How long the loop may wait for a socket: until the next chunk is due."""
        due = [queue[0][0] for queue in self._pending.values() if queue]
        return max(0.0, min([_TICK, *(when - time.monotonic() for when in due)]))
