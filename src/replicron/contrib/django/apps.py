"""The Django app: ``INSTALLED_APPS = [..., "replicron.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import request_started

__all__ = ["ReplicronConfig", "check_jobs"]


def check_jobs(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``manage.py check``: the settings, and every job built as a scheduler would (nothing
    connects or starts); one error ``replicron.E001`` per problem.

    A command that works on the databases (``migrate``, which passes ``databases``) gets
    them as warnings ``replicron.W001``: the jobs do not touch the schema, and a deploy
    migrates before it runs the code whose jobs are broken."""
    from .conf import read_settings
    from .declare import JobsProblems, build_scheduler

    try:
        build_scheduler(read_settings())
    except ImproperlyConfigured as exc:
        problems = exc.problems if isinstance(exc, JobsProblems) else str(exc).splitlines()
        if databases is not None:
            return [checks.Warning(problem, id="replicron.W001") for problem in problems]
        return [checks.Error(problem, id="replicron.E001") for problem in problems]
    return []


class ReplicronConfig(AppConfig):
    name = "replicron.contrib.django"
    label = "replicron"
    verbose_name = "Scheduled jobs (replicron)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .conf import read_settings

        settings = read_settings()  # a bad setting fails at startup, naming its key
        checks.register(check_jobs, "replicron")
        if settings.run_in_web_process:
            request_started.connect(_start_on_first_request, dispatch_uid="replicron-start")


def _start_on_first_request(**kwargs: Any) -> None:
    from .runtime import start_in_this_process

    request_started.disconnect(dispatch_uid="replicron-start")
    start_in_this_process()
