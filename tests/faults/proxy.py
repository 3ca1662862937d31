"""A userspace TCP proxy that can stop forwarding while keeping every socket open.

It stands for the load balancers, sidecars and NAT boxes between a replica and PostgreSQL:
when one of them hangs, neither end sees a FIN, an RST or even a missing ACK (the proxy's
kernel acknowledges everything), so TCP keepalives and ``tcp_user_timeout`` notice nothing.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

__all__ = ["HangingProxy"]


class HangingProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; :meth:`hang` stops moving bytes (sockets
    stay open, new connections are accepted and left alone), :meth:`close` ends it all."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._sockets: list[socket.socket] = [self._listener]
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
            for key, _ in self._selector.select(timeout=0.05):
                if key.data is None:
                    self._accept()
                elif not self._hung.is_set():
                    self._forward(key.fileobj, key.data)  # type: ignore[arg-type]
            if self._hung.is_set():
                # Keep everything open, read nothing: the peers' data sits in the buffers.
                for key in list(self._selector.get_map().values()):
                    if key.data is not None:
                        self._selector.unregister(key.fileobj)

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        self._sockets.append(client)
        if self._hung.is_set():
            return  # accepted by the kernel already; left alone
        upstream = socket.create_connection(self.target)
        self._sockets.append(upstream)
        self._selector.register(client, selectors.EVENT_READ, upstream)
        self._selector.register(upstream, selectors.EVENT_READ, client)

    def _forward(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        if not data:
            for sock in (source, sink):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                with contextlib.suppress(OSError):
                    sock.close()
            return
        with contextlib.suppress(OSError):
            sink.sendall(data)
