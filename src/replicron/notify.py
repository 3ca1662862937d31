"""Outbound alerts: tell the world outside the cluster when runs go wrong or a job goes
overdue, and ping a dead-man's switch per job, without ever delaying a run.

::

    notifier = Notifier("https://hooks.slack.com/services/T0/B0/XXXX",
                        pings={"nightly-report": "https://hc-ping.com/<uuid>"})
    notifier.attach(scheduler)

A :class:`Notifier` is a :class:`~replicron.Listener`: its hooks only queue a message, and
a background thread per destination delivers it (HTTP POST of JSON, or a call of your
function), with retries. ``attach`` adds it to a scheduler and, on a backend with a cluster registry
(PostgreSQL, embedded), also watches the cluster for overdue jobs; given in ``listeners=``
instead, it sends run alerts and pings only.

Who sends what, once:

* A run's outcome (``failed``, ``timed_out``, ``abandoned``; ``succeeded`` if asked) is
  known on the replica that ran it, which alone sends it. A replica killed mid-run sends
  nothing: its ping stops, which is what the dead-man's switch is for.
* An overdue job is seen by every replica reading the cluster; only one sends: the live
  replica with the smallest id among those that schedule the job (among all live replicas
  when none does). If that replica goes away while the job stays overdue, the next one
  sends again: an overdue alert comes at least once, normally once.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ._notify import (
    LINK_FIELDS,
    Courier,
    Delivery,
    NotificationCounts,
    check_headers,
    check_link,
    check_names,
    check_number,
    check_url,
    describe_call,
    mask_url,
    ping_url,
    secrets_of,
)
from ._problems import ProblemKind
from .cluster import ClusterStatus, JobView
from .dsn import mask_secrets
from .errors import ConfigurationError, InvalidNotifierError, JobNotFoundError
from .events import Listener, RunEvent
from .keys import check_job_name

if TYPE_CHECKING:
    from .scheduler import AsyncScheduler, Scheduler

__all__ = [
    "DEFAULT_EVENTS",
    "EVENTS",
    "FIELDS",
    "NotificationCounts",
    "Notifier",
    "check_url",
    "mask_url",
]

_logger = logging.getLogger(__name__)

#: What a notifier can alert on.
EVENTS = ("failed", "timed_out", "abandoned", "overdue", "succeeded")
#: What it alerts on unless told otherwise: every run that went wrong, and overdue jobs.
DEFAULT_EVENTS = ("failed", "timed_out", "abandoned", "overdue")
#: The fields of an alert's JSON (all of them unless ``fields`` says fewer); ``text`` is a
#: line for a person, and what Slack's incoming webhooks show.
FIELDS = (
    "event",
    "job",
    "tick",
    "outcome",
    "error",
    "replica",
    "run_id",
    "duration",
    "namespace",
    "manual",
    "link",
    "text",
)


class Notifier(Listener):
    """Sends alerts (``url`` gets a JSON POST, or ``call`` is called with the same dict on
    the notifier's thread) and per-job pings; see the module's documentation.

    ``events`` picks from :data:`EVENTS`; ``jobs`` and ``tags`` limit alerts to those jobs
    (any match; both empty: every job; tags need :meth:`attach`). ``pings`` maps a job's name
    to a dead-man's-switch URL: POSTed ``<url>/start`` as a run starts, ``<url>`` when it
    succeeds, ``<url>/fail`` (with the error) when it fails, times out or is cut off.
    ``link`` is a URL template for the ``link`` field (``{job}``, ``{tick}``, ``{event}``,
    ``{replica}``, ``{run_id}``, ``{namespace}``). A message is tried ``attempts`` times,
    ``backoff`` seconds after the first failure and twice as long after each next one (at
    most ``max_backoff``, with jitter), each request cut off after ``timeout`` seconds; at
    most ``max_queue`` wait, beyond which the oldest is dropped. A scheduler's stop waits up
    to ``flush_timeout`` seconds for the queue. Every setting is checked here, and a bad one
    raises :class:`~replicron.InvalidNotifierError` naming it.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        call: Callable[[dict[str, Any]], object] | None = None,
        events: Iterable[str] = DEFAULT_EVENTS,
        jobs: Iterable[str] = (),
        tags: Iterable[str] = (),
        fields: Iterable[str] = FIELDS,
        headers: Mapping[str, str] | None = None,
        pings: Mapping[str, str] | None = None,
        link: str | None = None,
        namespace: str = "",
        timeout: float = 5.0,
        attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        max_queue: int = 1000,
        flush_timeout: float = 5.0,
        error_chars: int = 1000,
        overdue_every: float = 30.0,
    ) -> None:
        if url is not None and call is not None:
            raise InvalidNotifierError("notifier: give url or call, not both")
        self._url = None if url is None else check_url(url, "notifier url")
        if call is not None and (not callable(call) or inspect.iscoroutinefunction(call)):
            raise InvalidNotifierError(
                f"notifier call: must be a plain function (it runs on the notifier's thread), "
                f"not {describe_call(call)}"
            )
        self._call = call
        self._events = check_names(events, "notifier events", EVENTS)
        self._jobs = check_names(jobs, "notifier jobs")
        self._tags = check_names(tags, "notifier tags")
        self._fields = check_names(fields, "notifier fields", FIELDS)
        self._link = check_link(link)
        if not isinstance(namespace, str):
            raise InvalidNotifierError(f"notifier namespace: must be a string, not {namespace!r}")
        self._namespace = namespace
        self._error_chars = int(
            check_number(error_chars, "notifier error_chars", least=1, whole=True)
        )
        self._overdue_every = check_number(overdue_every, "notifier overdue_every", least=0.01)
        self._flush_timeout = check_number(flush_timeout, "notifier flush_timeout", least=0)
        header_values = check_headers(headers)
        self._header_names = tuple(header_values)
        self._courier = Courier(
            logger=_logger,
            headers=header_values,
            timeout=check_number(timeout, "notifier timeout", least=0.001),
            attempts=int(check_number(attempts, "notifier attempts", least=1, whole=True)),
            backoff=check_number(backoff, "notifier backoff", least=0),
            max_backoff=check_number(max_backoff, "notifier max_backoff", least=0),
            max_queue=int(check_number(max_queue, "notifier max_queue", least=1, whole=True)),
            secrets=[
                *(secrets_of(self._url) if self._url else ()),
                *(v for v in header_values.values()),
            ],
        )
        self._pings: dict[str, str] = {}
        for job, ping in (pings or {}).items():
            self.set_ping(job, ping)
        # A notifier may serve several schedulers: it stops with the last of them, and each
        # decides overdue alerts as its own replica.
        self._schedulers: list[Scheduler | AsyncScheduler] = []
        self._running: set[str] = set()
        self._overdue_sent: dict[str, set[tuple[str, datetime]]] = {}

    # ---- configuration ---------------------------------------------------------------

    def set_ping(self, job: str, url: str | None) -> None:
        """Ping ``url`` around each run of ``job`` from now on (``None``: stop pinging)."""
        try:
            check_job_name(job)
        except ConfigurationError as exc:
            raise InvalidNotifierError(f"notifier pings: {exc}") from None
        if url is None:
            self._pings.pop(job, None)
            return
        self._pings[job] = check_url(url, f"notifier: job {job!r}: ping URL")
        self._courier.add_secrets(secrets_of(url))

    @property
    def counts(self) -> NotificationCounts:
        """Messages sent, failed (every attempt), dropped and retried so far (a copy)."""
        counts = self._courier.counts
        return NotificationCounts(counts.sent, counts.failed, counts.dropped, counts.retried)

    def __repr__(self) -> str:
        target = mask_url(self._url) if self._url else ("call" if self._call else "pings only")
        return (
            f"Notifier({target}, events={sorted(self._events)}, pings={sorted(self._pings)}, "
            f"headers={list(self._header_names)})"
        )

    # ---- the scheduler ----------------------------------------------------------------

    def attach(self, scheduler: Scheduler | AsyncScheduler) -> Callable[[], None]:
        """Listen to ``scheduler``, know its jobs' tags, and (when overdue is among the
        events) watch its cluster; returns the function that detaches it."""
        scheduler.add_listener(self)
        self._schedulers.append(scheduler)
        replica_id = scheduler.replica_id
        unwatch: Callable[[], None] | None = None
        if "overdue" in self._events and (self._url is not None or self._call is not None):
            unwatch = scheduler.watch_cluster(
                lambda status: self._cluster_read(status, replica_id), self._overdue_every
            )

        def detach() -> None:
            scheduler.remove_listener(self)
            if scheduler in self._schedulers:
                self._schedulers.remove(scheduler)
            if unwatch is not None:
                unwatch()

        return detach

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds until every queued message was delivered or given
        up; whether that happened."""
        return self._courier.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued for up to ``timeout`` (default ``flush_timeout``) seconds
        and drop the rest; a scheduler's stop does this by itself."""
        self._courier.stop(self._flush_timeout if timeout is None else timeout)

    # ---- listener hooks: they queue, never wait -------------------------------------

    def on_started(self, replica_id: str) -> None:
        self._running.add(replica_id)
        if not self._schedulers and (self._tags or "overdue" in self._events):
            _logger.info(
                "notifier given as a listener: overdue alerts and tag filters need "
                "notifier.attach(scheduler)",
                extra={"event": "notify_unattached"},
            )

    def on_stopped(self, replica_id: str) -> Awaitable[None] | None:
        self._running.discard(replica_id)
        if self._running:  # another scheduler it serves still runs: its alerts go on
            return None
        # Awaited by the stop, off the loop: the flush waits on the network for up to
        # flush_timeout, and the loop may be an application's.
        return asyncio.to_thread(self.close)

    def before_run(self, event: RunEvent) -> None:
        self._ping(event, "start")

    def after_success(self, event: RunEvent) -> None:
        self._ping(event, "")
        self._alert(event, "succeeded")

    def after_failure(self, event: RunEvent) -> None:
        self._ping(event, "fail")
        self._alert(event, "failed")

    def on_timeout(self, event: RunEvent) -> None:
        self._ping(event, "fail")
        self._alert(event, "timed_out")

    def on_abandoned(self, event: RunEvent) -> None:
        self._ping(event, "fail")
        self._alert(event, "abandoned")

    # ---- messages ---------------------------------------------------------------------

    def _wanted(self, job: str) -> bool:
        if not (self._jobs or self._tags):
            return True
        if job in self._jobs:
            return True
        for scheduler in self._schedulers if self._tags else ():
            try:
                if scheduler.get_job(job).tags & self._tags:
                    return True
            except JobNotFoundError:
                continue
        return False

    def _error_text(self, event: RunEvent) -> str | None:
        if event.error is not None:
            text = f"{type(event.error).__name__}: {event.error}"
        elif event.detail:
            text = event.detail
        else:
            return None
        text = mask_secrets(text)
        if len(text) > self._error_chars:
            text = text[: self._error_chars - 1] + "…"
        return text

    def _ping(self, event: RunEvent, suffix: str) -> None:
        base = self._pings.get(event.job)
        if base is None:
            return
        body = (self._error_text(event) or "").encode() if suffix == "fail" else b""
        self._courier.put(
            Delivery(
                label=f"ping {suffix or 'success'} of job {event.job!r} to {mask_url(base)}",
                url=ping_url(base, suffix),
                body=body,
                content_type="text/plain; charset=utf-8",
                context=_context(
                    event.job, event.scheduled_at.isoformat(), event.replica_id, event.run_id
                ),
            )
        )

    def _alert(self, event: RunEvent, kind: str) -> None:
        if kind not in self._events or (self._url is None and self._call is None):
            return
        if not self._wanted(event.job):
            return
        duration = event.duration
        error = self._error_text(event)
        tick = event.scheduled_at.isoformat()
        what = kind.replace("_", " ")
        text = f"replicron: job {event.job!r} {what} (tick {tick}, replica {event.replica_id})"
        self._send(
            {
                "event": kind,
                "job": event.job,
                "tick": tick,
                "outcome": None if event.outcome is None else event.outcome.value,
                "error": error,
                "replica": event.replica_id,
                "run_id": event.run_id,
                "duration": None if duration is None else duration.total_seconds(),
                "namespace": self._namespace,
                "manual": event.manual,
            },
            text + (f": {error}" if error else ""),
        )

    def _send(self, payload: dict[str, Any], text: str) -> None:
        context = _context(payload["job"], payload["tick"], payload["replica"], payload["run_id"])
        if self._link is not None:
            values = {name: quote(str(payload.get(name) or ""), safe="") for name in LINK_FIELDS}
            payload["link"] = self._link.format(**values)
            text += f" {payload['link']}"
        else:
            payload["link"] = None
        payload["text"] = text
        payload = {name: value for name, value in payload.items() if name in self._fields}
        label = f"alert {payload.get('event', '')} of job {payload.get('job', '')!r}"
        if self._call is not None:
            self._courier.put(
                Delivery(
                    label=f"{label} to {describe_call(self._call)}",
                    call=self._call,
                    payload=payload,
                    context=context,
                )
            )
        elif self._url is not None:
            self._courier.put(
                Delivery(
                    label=f"{label} to {mask_url(self._url)}",
                    url=self._url,
                    body=json.dumps(payload, default=str).encode(),
                    context=context,
                )
            )

    # ---- overdue ------------------------------------------------------------------------

    def _cluster_read(self, status: ClusterStatus | None, replica_id: str) -> None:
        """``watch_cluster``'s callback, on the loop of the scheduler of ``replica_id``."""
        if status is None:
            return
        sent = self._overdue_sent.setdefault(replica_id, set())
        overdue_now: set[tuple[str, datetime]] = set()
        for view in status.jobs:
            if view.overdue_since is None or not self._wanted(view.job):
                continue
            key = (view.job, view.overdue_since)
            overdue_now.add(key)
            if key in sent or self._sender(status, view) != replica_id:
                continue
            sent.add(key)
            problem = next(
                (p for p in status.job_problems(view) if p.kind is ProblemKind.OVERDUE), None
            )
            detail = problem.text if problem is not None else "overdue"
            payload = {
                "event": "overdue",
                "job": view.job,
                "tick": view.overdue_since.isoformat(),
                "outcome": None,
                "error": None,
                "replica": replica_id,
                "run_id": None,
                "duration": None,
                "namespace": status.namespace,
                "manual": False,
            }
            self._send(payload, f"replicron: job {view.job!r} {detail}")
        # A job that ran again and went overdue later is a new alert.
        sent &= overdue_now

    @staticmethod
    def _sender(status: ClusterStatus, view: JobView) -> str | None:
        candidates = view.scheduled_by or [r.replica_id for r in status.replicas if r.alive]
        return min(candidates, default=None)


def _context(job: str, tick: str, replica: str, run_id: int | None) -> dict[str, object]:
    return {"job": job, "tick": tick, "replica": replica, "run_id": run_id}
