"""A notifier's settings, checked; and the delivery of its messages: a bounded queue
drained by a background thread per destination, with retries, so that no run and no
scheduler loop ever waits for an endpoint.

URLs carry secrets (a Slack webhook's path, a healthchecks UUID, ``user:pass@``,
``?token=``), so nothing here logs or raises a URL or header value as given: only
:func:`mask_url`'s form, and error texts scrubbed of the URL's parts.
"""

from __future__ import annotations

import base64
import functools
import heapq
import itertools
import logging
import math
import random
import re
import string
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ._notify_http import PermanentFailure, post
from .errors import InvalidNotifierError

__all__ = [
    "LINK_FIELDS",
    "Courier",
    "Delivery",
    "NotificationCounts",
    "check_headers",
    "check_link",
    "check_names",
    "check_number",
    "check_url",
    "describe_call",
    "mask_url",
    "ping_url",
    "scrub",
    "secrets_of",
]

#: Shown in place of a secret.
MASK = "***"


def mask_url(url: str) -> str:
    """``url`` with only its scheme, host and port left: the user info, path, query and
    fragment may each hold a token."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return MASK
    if ":" in host:
        host = f"[{host}]"
    rest = "/" + MASK if (parts.path not in ("", "/") or parts.query or parts.fragment) else ""
    return f"{parts.scheme}://{host}{port}{rest}" if host else MASK


_URL_IN_TEXT = re.compile(r"\bhttps?://[^\s'\"<>]+", re.IGNORECASE)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (and every URL's secret parts) replaced by ``***``, and
    any other URL in it masked: an HTTP client called by a ``call=`` function quotes the
    URL it was given, which this notifier never saw."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _URL_IN_TEXT.sub(lambda found: mask_url(found[0]), text)


def describe_call(call: object) -> str:
    """A ``call=`` function as logs and errors name it: by its name, never by its ``repr``,
    which for a ``functools.partial`` shows its arguments (the webhook URL, say)."""
    while isinstance(call, functools.partial):
        call = call.func
    if isinstance(call, types.FunctionType | types.BuiltinFunctionType | types.MethodType):
        return f"function {call.__qualname__}"
    return f"a {type(call).__qualname__}"


def secrets_of(url: str) -> list[str]:
    """The parts of ``url`` that may be secret: the whole, its user info, path segments
    and query values, so that a message quoting any of them is scrubbed."""
    found = [url]
    try:
        parts = urlsplit(url)
    except ValueError:
        return found
    if parts.password:
        found.append(parts.password)
    if parts.username:
        found.append(parts.username)
    found.extend(segment for segment in parts.path.split("/") if segment)
    for pair in parts.query.split("&"):
        found.append(pair.partition("=")[2])
    if parts.fragment:
        found.append(parts.fragment)
    return found


#: The placeholders a ``link`` template may use.
LINK_FIELDS = ("job", "tick", "event", "replica", "run_id", "namespace")
_SCHEMES = ("http", "https")


def check_url(value: object, where: str = "") -> str:
    """``value`` if it is an http(s) URL with a host, else :class:`InvalidNotifierError`
    naming ``where`` and showing the URL masked."""
    said = f"{where}: " if where else ""
    if not isinstance(value, str):
        raise InvalidNotifierError(f"{said}must be an http(s) URL string, not {value!r}")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (a port out of range raises here)
    except ValueError:
        raise InvalidNotifierError(f"{said}not a valid URL: {mask_url(value)!r}") from None
    if parts.scheme.lower() not in _SCHEMES:
        shown = f"{parts.scheme}://" if parts.scheme else "no scheme"
        raise InvalidNotifierError(
            f"{said}must be an http:// or https:// URL, not {shown} ({mask_url(value)!r})"
        )
    if not parts.hostname:
        raise InvalidNotifierError(f"{said}the URL has no host ({mask_url(value)!r})")
    return value


def check_number(value: object, where: str, *, least: float, whole: bool = False) -> float:
    kinds = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        kind = "a whole number" if whole else "a finite number"
        raise InvalidNotifierError(f"{where}: must be {kind}, not {value!r}")
    if value < least:
        raise InvalidNotifierError(f"{where}: must be at least {least}, not {value!r}")
    return float(value)


def check_names(
    value: Iterable[str] | str, where: str, known: tuple[str, ...] = ()
) -> frozenset[str]:
    items = [value] if isinstance(value, str) else list(value)
    for item in items:
        if not isinstance(item, str):
            raise InvalidNotifierError(f"{where}: must be strings, not {item!r}")
        if known and item not in known:
            raise InvalidNotifierError(
                f"{where}: unknown name {item!r} (known: {', '.join(known)})"
            )
    return frozenset(items)


def check_headers(value: Mapping[str, str] | None) -> dict[str, str]:
    headers = dict(value or {})
    for name, text in headers.items():
        if not isinstance(name, str) or not name or any(c in name for c in ":\r\n "):
            raise InvalidNotifierError(f"notifier headers: {name!r} is not a header name")
        if not isinstance(text, str) or "\r" in text or "\n" in text:
            raise InvalidNotifierError(
                f"notifier headers: {name}: the value must be a one-line string"
            )
    return headers


def check_link(template: object) -> str | None:
    if template is None:
        return None
    if not isinstance(template, str):
        raise InvalidNotifierError(f"notifier link: must be a string, not {template!r}")
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise InvalidNotifierError(f"notifier link: not a valid template: {exc}") from None
    for name in names:
        if name not in LINK_FIELDS:
            raise InvalidNotifierError(
                f"notifier link: unknown placeholder {{{name}}} "
                f"(known: {', '.join('{' + n + '}' for n in LINK_FIELDS)})"
            )
    return template


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}".lower()


def ping_url(base: str, suffix: str) -> str:
    """``base`` with ``/suffix`` added to its path (healthchecks.io's ``/start``, ``/fail``)."""
    if not suffix:
        return base
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + suffix))


@dataclass(order=True)
class Delivery:
    """One message: an HTTP request, or a call of the user's function."""

    due: float = 0.0
    seq: int = 0
    #: What the logs call it: the masked target and the event, e.g. ``alert failed``.
    label: str = field(compare=False, default="")
    url: str | None = field(compare=False, default=None)
    body: bytes = field(compare=False, default=b"")
    content_type: str = field(compare=False, default="application/json")
    call: Callable[[dict[str, Any]], object] | None = field(compare=False, default=None)
    payload: dict[str, Any] = field(compare=False, default_factory=dict)
    attempt: int = field(compare=False, default=1)
    #: What a log record about it carries: the job, tick, replica and run it is about.
    context: dict[str, object] = field(compare=False, default_factory=dict)

    def extra(self, event: str) -> dict[str, object]:
        return {"event": event, **self.context}


@dataclass
class NotificationCounts:
    """What became of the messages: delivered, given up after every attempt, dropped
    (the queue was full, or they were left at shutdown), and retries made."""

    sent: int = 0
    failed: int = 0
    dropped: int = 0
    retried: int = 0


class _Waiting:
    """The deliveries waiting: taken by due time, dropped oldest first, each in O(log n) (the
    hooks that queue run on the scheduler's loop). One taken or dropped leaves a stale entry
    in the other heap, skipped when met and swept out once stale entries abound."""

    def __init__(self) -> None:
        self._by_due: list[Delivery] = []
        self._by_age: list[tuple[int, Delivery]] = []
        self._seqs: set[int] = set()

    def __len__(self) -> int:
        return len(self._seqs)

    def push(self, delivery: Delivery) -> None:
        self._seqs.add(delivery.seq)
        heapq.heappush(self._by_due, delivery)
        heapq.heappush(self._by_age, (delivery.seq, delivery))
        if len(self._by_due) + len(self._by_age) > 4 * len(self._seqs) + 64:
            self._by_due = [d for d in self._by_due if d.seq in self._seqs]
            heapq.heapify(self._by_due)
            self._by_age = sorted({s: (s, d) for s, d in self._by_age if s in self._seqs}.values())

    def first_due(self) -> Delivery | None:
        while self._by_due and self._by_due[0].seq not in self._seqs:
            heapq.heappop(self._by_due)
        return self._by_due[0] if self._by_due else None

    def take_first_due(self) -> Delivery:
        delivery = heapq.heappop(self._by_due)
        self._seqs.discard(delivery.seq)
        return delivery

    def oldest_seq(self) -> int | None:
        while self._by_age and self._by_age[0][0] not in self._seqs:
            heapq.heappop(self._by_age)
        return self._by_age[0][0] if self._by_age else None

    def drop_oldest(self) -> Delivery:
        while True:
            seq, delivery = heapq.heappop(self._by_age)
            if seq in self._seqs:
                self._seqs.discard(seq)
                return delivery

    def clear(self) -> int:
        left = len(self._seqs)
        self._by_due, self._by_age, self._seqs = [], [], set()
        return left


class Courier:
    """Sends deliveries on background threads; :meth:`put` never blocks on the network.

    Each destination (an origin: scheme, host and port; or the ``call=`` function) has its
    own queue and thread, so that a ping service that stopped answering does not hold the
    alerts to a chat webhook up behind its timeouts. The queues share ``max_queue``."""

    def __init__(
        self,
        *,
        logger: logging.Logger,
        headers: Mapping[str, str],
        timeout: float,
        attempts: int,
        backoff: float,
        max_backoff: float,
        max_queue: int,
        secrets: Iterable[str],
    ) -> None:
        self._logger = logger
        self._headers = dict(headers)
        self._timeout, self._attempts = timeout, attempts
        self._backoff, self._max_backoff = backoff, max_backoff
        self._max_queue = max_queue
        self._secrets = list(secrets)
        self._queues: dict[str, _Waiting] = {}  # by destination, each with its thread
        self._seq = itertools.count()
        self._busy = 0
        self._cond = threading.Condition()
        self.counts = NotificationCounts()

    def add_secrets(self, secrets: Iterable[str]) -> None:
        with self._cond:
            self._secrets.extend(secrets)

    def put(self, delivery: Delivery) -> None:
        """Queue ``delivery`` (at once, whatever the endpoint does); a full queue drops its
        oldest message."""
        with self._cond:
            delivery.seq = next(self._seq)
            delivery.due = time.monotonic()
            dropped = self._make_room()
            destination = "call" if delivery.url is None else _origin(delivery.url)
            queue = self._queues.get(destination)
            if queue is None:  # no thread serves it: start one
                queue = self._queues[destination] = _Waiting()
                threading.Thread(
                    target=self._work,
                    args=(destination, queue),
                    name="replicron-notifier",
                    daemon=True,
                ).start()
            queue.push(delivery)
            self._cond.notify_all()
        if dropped is not None:
            self._logger.warning(
                "notifier queue full (%d messages): dropped the oldest, %s",
                self._max_queue,
                dropped.label,
                extra=dropped.extra("notify_dropped"),
            )

    def _make_room(self) -> Delivery | None:
        if sum(map(len, self._queues.values())) < self._max_queue:
            return None
        ages = [(q.oldest_seq(), q) for q in self._queues.values() if q]
        oldest = min(ages, key=lambda age: age[0] or 0)[1].drop_oldest()
        self.counts.dropped += 1
        return oldest

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queued message to be delivered or given
        up (retries included); whether the queue emptied."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy or any(self._queues.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self, timeout: float) -> None:
        """Deliver what is queued for up to ``timeout`` seconds, then drop the rest (counted
        and logged); the thread ends once idle, and a later :meth:`put` starts another."""
        if self.flush(timeout):
            return
        with self._cond:
            left = sum(queue.clear() for queue in self._queues.values())
            self.counts.dropped += left
            self._cond.notify_all()
        if left:
            self._logger.warning(
                "notifier stopped with %d messages undelivered after %.1f s",
                left,
                timeout,
                extra={"event": "notify_dropped"},
            )

    def _work(self, destination: str, queue: _Waiting) -> None:
        while True:
            with self._cond:
                delivery = self._next(queue)
                if delivery is None:
                    del self._queues[destination]  # under the lock: put() starts another
                    return
                self._busy += 1
            try:
                self._attempt(delivery, queue)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _next(self, queue: _Waiting) -> Delivery | None:
        """The first due delivery of ``queue``, waiting for it; ``None`` when it is empty
        (lock held)."""
        while (first := queue.first_due()) is not None:
            wait = first.due - time.monotonic()
            if wait <= 0:
                return queue.take_first_due()
            self._cond.wait(wait)
        return None

    def _attempt(self, delivery: Delivery, queue: _Waiting) -> None:
        try:
            self._send(delivery)
        # A function's SystemExit too: it would end this thread, and every delivery, silently.
        except BaseException as exc:
            reason = scrub(f"{type(exc).__name__}: {exc}", self._secrets)
            final = isinstance(exc, PermanentFailure) or delivery.attempt >= self._attempts
            with self._cond:
                if final:
                    self.counts.failed += 1
                else:
                    self.counts.retried += 1
                    delay = min(self._max_backoff, self._backoff * 2 ** (delivery.attempt - 1))
                    delivery.attempt += 1
                    # Jitter, so that replicas retrying one endpoint do not come back together.
                    delivery.due = time.monotonic() + delay * random.uniform(0.5, 1.0)
                    queue.push(delivery)
            if final:
                self._logger.warning(
                    "notification %s not delivered after %d attempts: %s",
                    delivery.label,
                    delivery.attempt,
                    reason,
                    extra=delivery.extra("notify_failed"),
                )
            else:
                self._logger.info(
                    "notification %s failed (attempt %d of %d), retrying: %s",
                    delivery.label,
                    delivery.attempt - 1,
                    self._attempts,
                    reason,
                    extra=delivery.extra("notify_retry"),
                )
            return
        with self._cond:
            self.counts.sent += 1

    def _send(self, delivery: Delivery) -> None:
        if delivery.call is not None:
            delivery.call(delivery.payload)
            return
        assert delivery.url is not None
        url, headers = delivery.url, {"Content-Type": delivery.content_type}
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            # urllib takes no user info in a URL: it goes as HTTP basic authentication.
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
            url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        headers.update(self._headers)
        post(url, delivery.body, headers, self._timeout)
