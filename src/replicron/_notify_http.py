"""One notification's HTTP POST, bounded as a whole by its timeout and never redirected:
a socket's timeout bounds each read, not the request, and a redirect would carry the
request's credentials to another host."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["PermanentFailure", "post"]

#: A response this long is read no further: only its status counts.
_READ_AT_MOST = 64 * 1024


class PermanentFailure(Exception):
    """An answer no retry will change (a redirect, a 4xx other than 408 and 429)."""


def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> None:
    """POST ``body`` to ``url`` (no user info in it), done or cut off within ``timeout``
    seconds; raises :class:`PermanentFailure` when no retry will help, another exception
    when one might."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    with _Watchdog(timeout) as watchdog:
        try:
            with _opener(watchdog).open(request, timeout=timeout) as response:
                response.read(_READ_AT_MOST)
                # Cut off, an answer can look whole (the headers end where the stream did).
                if watchdog.finish():
                    raise TimeoutError(f"no whole answer within {timeout:g} s")
        except urllib.error.HTTPError as exc:
            exc.close()
            # A refused request (bad token, gone webhook) stays refused, and a redirect
            # is not followed: no retries.
            if 300 <= exc.code < 400 or (400 <= exc.code < 500 and exc.code not in (408, 429)):
                what = " (a redirect, not followed)" if exc.code < 400 else ""
                raise PermanentFailure(f"HTTP {exc.code} {exc.reason}{what}") from None
            raise OSError(f"HTTP {exc.code} {exc.reason}") from None
        except Exception as exc:
            if watchdog.expired and not isinstance(exc, TimeoutError):
                raise TimeoutError(f"no whole answer within {timeout:g} s") from None
            raise


class _Watchdog:
    """Shuts the sockets of one request down when its time is up. A socket's timeout bounds
    each read, not the request: an endpoint answering a byte at a time would otherwise hold
    the notifier's thread, and every message behind it, for ever."""

    def __init__(self, seconds: float) -> None:
        self.expired = self._finished = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.name = "replicron-notifier-timeout"

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def finish(self) -> bool:
        """Stand down, the answer read; whether it came too late (the sockets were shut)."""
        with self._lock:
            self._finished = True
            self._timer.cancel()
            return self.expired

    def _expire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: nothing to cut
        sock.shutdown(socket.SHUT_RDWR)


class _Watched(urllib.request.AbstractHTTPHandler):
    """Opens each connection (HTTP or HTTPS: one mixin for both handlers) through its
    watchdog."""

    watchdog: _Watchdog

    def do_open(
        self, http_class: Any, req: urllib.request.Request, **kw: Any
    ) -> http.client.HTTPResponse:
        watchdog = self.watchdog

        def connection(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
            conn: http.client.HTTPConnection = http_class(*args, **kwargs)
            create = conn._create_connection  # type: ignore[attr-defined]

            def create_watched(*a: Any, **k: Any) -> socket.socket:
                sock: socket.socket = create(*a, **k)
                watchdog.watch(sock)
                return sock

            conn._create_connection = create_watched  # type: ignore[attr-defined]
            return conn

        return super().do_open(connection, req, **kw)


class _WatchedHTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is refused, not followed: urllib would turn the POST into a bodiless GET
    and take the basic authentication and headers to whatever host ``Location`` names."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(watchdog: _Watchdog) -> urllib.request.OpenerDirector:
    handlers: list[urllib.request.BaseHandler] = [_WatchedHTTP(), _WatchedHTTPS(), _NoRedirects()]
    for handler in handlers[:2]:
        handler.watchdog = watchdog  # type: ignore[attr-defined]
    return urllib.request.build_opener(*handlers)
