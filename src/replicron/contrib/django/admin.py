"""The admin: the cluster's jobs, recent runs and replicas, read-only, with the actions pause,
resume and run now. Pause and resume are the cluster-wide pauses of ``replicron pause``;
run now asks every replica that schedules the job for one manual run, run once."""

from __future__ import annotations

import functools
import operator
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import admin, messages
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.timezone import localtime

from replicron.backends.base import ClusterRegistry, RunRequests
from replicron.cluster import ClusterStatus, JobView
from replicron.errors import ReplicronError

from .conf import make_backend, read_settings
from .models import RegisteredJob, Replica, Run

__all__ = ["RegisteredJobAdmin", "ReplicaAdmin", "RunAdmin"]

_statuses: weakref.WeakKeyDictionary[HttpRequest, ClusterStatus | None] = (
    weakref.WeakKeyDictionary()
)


#: The request whose changelist is being drawn, for the columns that read the cluster.
_page = threading.local()


def _backend() -> Any:
    backend = make_backend(read_settings(), migrate=False)
    if not isinstance(backend, ClusterRegistry) or not isinstance(backend, RunRequests):
        raise ReplicronError("this backend keeps no cluster: nothing to pause or run")
    return backend


def _call(work: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    return async_to_sync(work)(_backend())


def _on(
    act: Callable[[Any, str, str], Coroutine[Any, Any, Any]], backend: Any, *, job: str, by: str
) -> Coroutine[Any, Any, Any]:
    return act(backend, job, by)


def _status(request: HttpRequest) -> ClusterStatus | None:
    """The cluster's status, read once per request page."""
    if request not in _statuses:
        try:
            _statuses[request] = _call(lambda backend: backend.cluster_status())
        except Exception:  # the page shows what the tables hold without it
            _statuses[request] = None
    return _statuses[request]


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _when(instant: datetime | None) -> str:
    """An instant to the second in the project's time zone: ticks may be seconds apart."""
    if instant is None:
        return "-"
    return str(localtime(instant).isoformat(sep=" ", timespec="seconds"))


def _instant(field: str, label: str) -> Any:
    """A column or read-only field that shows the model's ``field`` with :func:`_when`."""
    read = operator.attrgetter(field)

    @admin.display(description=label, ordering=field)
    def show(model_admin: Any, row: Any) -> str:
        return _when(read(row))

    return show


@admin.register(RegisteredJob)
class RegisteredJobAdmin(_ReadOnly):
    list_display = ("job", "trigger", "state", "last_outcome", "last_run", "next_due")
    readonly_fields = (
        "job",
        "trigger",
        "state",
        "last_outcome",
        "last_run",
        "next_due",
        "runs",
        "replica_id",
        "fingerprint",
        "seen",
    )
    fields = readonly_fields
    search_fields = ("job",)
    sortable_by = ()  # one row per job: the ordering picks each job's latest registration
    actions = ("pause", "resume", "run_now")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).order_by("job", "-last_seen").distinct("job")

    def _view(self, request: HttpRequest, job: RegisteredJob) -> JobView | None:
        status = _status(request)
        if status is None:
            return None
        return next((view for view in status.jobs if view.job == job.job), None)

    @admin.display(description="state")
    def state(self, job: RegisteredJob) -> str:
        request = _page.request
        view = self._view(request, job)
        status = _status(request)
        if view is None or status is None:
            return "-"
        return ", ".join(status.job_states(view))

    @admin.display(description="last outcome")
    def last_outcome(self, job: RegisteredJob) -> str:
        view = self._view(_page.request, job)
        return (view.last_outcome or "-") if view else "-"

    @admin.display(description="last tick")
    def last_run(self, job: RegisteredJob) -> str:
        view = self._view(_page.request, job)
        return _when(view.last_scheduled_at if view else None)

    @admin.display(description="next due")
    def next_due(self, job: RegisteredJob) -> str:
        view = self._view(_page.request, job)
        return _when(view.next_due if view else None)

    @admin.display(description="runs")
    def runs(self, job: RegisteredJob) -> str:
        query = urlencode({"job__exact": job.job})
        url = reverse("admin:replicron_run_changelist")
        return str(format_html('<a href="{}?{}">the runs of {}</a>', url, query, job.job))

    seen = _instant("last_seen", "last seen")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        _page.request = request  # the columns read the cluster's status of this request
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        _page.request = request
        return super().change_view(request, object_id, form_url, extra_context)

    def _each(
        self,
        request: HttpRequest,
        queryset: Any,
        act: Callable[[Any, str, str], Coroutine[Any, Any, Any]],
        said: Callable[[str, Any], str],
    ) -> None:
        by = f"django-admin:{request.user.get_username()}"
        for name in queryset.values_list("job", flat=True):
            try:
                answer = _call(functools.partial(_on, act, job=name, by=by))
            except Exception as exc:
                self.message_user(request, f"{name}: {exc}", messages.ERROR)
            else:
                self.message_user(request, said(name, answer), messages.SUCCESS)

    @admin.action(description="Pause the selected jobs on every replica")
    def pause(self, request: HttpRequest, queryset: Any) -> None:
        self._each(
            request,
            queryset,
            lambda backend, job, by: backend.pause(job, by),
            lambda job, done: f"paused {job!r}" if done else f"{job!r} was paused already",
        )

    @admin.action(description="Resume the selected jobs")
    def resume(self, request: HttpRequest, queryset: Any) -> None:
        self._each(
            request,
            queryset,
            lambda backend, job, by: backend.resume(job),
            lambda job, done: f"resumed {job!r}" if done else f"{job!r} was not paused",
        )

    @admin.action(description="Run the selected jobs once now")
    def run_now(self, request: HttpRequest, queryset: Any) -> None:
        self._each(
            request,
            queryset,
            lambda backend, job, by: backend.request_run(job, by),
            lambda job, at: f"asked for a run of {job!r} at {at.isoformat()}",
        )


@admin.register(Run)
class RunAdmin(_ReadOnly):
    list_display = (
        "run_id",
        "job",
        "tick",
        "outcome",
        "ticks",
        "replica_id",
        "started",
        "finished",
        "manual",
    )
    list_filter = ("outcome", "manual", "job")
    search_fields = ("job", "replica_id", "error")
    readonly_fields = (*list_display, "through", "error")
    fields = readonly_fields

    tick = _instant("scheduled_at", "tick")
    started = _instant("started_at", "started")
    finished = _instant("finished_at", "finished")
    through = _instant("scheduled_through", "through tick")  # a range of missed ticks


class _Presence(admin.SimpleListFilter):
    """Live replicas unless asked for the departed: with the default replica id
    (``hostname:pid``) every restart leaves a row behind."""

    title = "presence"
    parameter_name = "presence"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("departed", "departed"), ("all", "all")]

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "live",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        status = _status(request)
        if status is None or self.value() == "all":
            return queryset
        live = [replica.replica_id for replica in status.live_replicas]
        if self.value() == "departed":
            return queryset.exclude(replica_id__in=live)
        return queryset.filter(replica_id__in=live)


@admin.register(Replica)
class ReplicaAdmin(_ReadOnly):
    list_display = ("replica_id", "alive", "coordination", "started", "seen", "stopped")
    list_filter = (_Presence,)
    readonly_fields = ("replica_id", "coordination", "started", "seen", "stopped")
    fields = readonly_fields

    started = _instant("started_at", "started")
    seen = _instant("last_seen", "last seen")
    stopped = _instant("stopped_at", "stopped")

    @admin.display(description="alive", boolean=True)
    def alive(self, replica: Replica) -> bool | None:
        status = _status(_page.request)
        if status is None:
            return None
        return next((r.alive for r in status.replicas if r.replica_id == replica.replica_id), None)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        _page.request = request
        return super().changelist_view(request, extra_context)
