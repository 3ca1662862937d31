"""replicron's tables as read-only Django models (``managed = False``: replicron's own
migrations make them, see ``migrations/``), each limited to the project's namespace."""

from __future__ import annotations

from typing import Any

from django.db import models

__all__ = ["RegisteredJob", "Replica", "Run"]


class _InNamespace(models.Manager):
    """The rows of the namespace ``settings.REPLICRON`` names."""

    def get_queryset(self) -> Any:
        from .conf import read_settings

        return super().get_queryset().filter(namespace=read_settings().namespace)


class RegisteredJob(models.Model):
    """A job as a replica registered it (``replicron_jobs``: one row per job per replica;
    the admin shows each job once, by its latest registration)."""

    job = models.TextField(primary_key=True)
    namespace = models.TextField()
    replica_id = models.TextField("registered by")
    trigger = models.TextField()
    fingerprint = models.TextField("definition")
    last_seen = models.DateTimeField()

    objects = _InNamespace()

    class Meta:
        managed = False
        db_table = "replicron_jobs"
        verbose_name = "job"
        ordering = ("job", "-last_seen")

    def __str__(self) -> str:
        return str(self.job)


class Run(models.Model):
    """A row of the ledger (``replicron_runs``): one tick or manual run and its outcome."""

    run_id = models.BigIntegerField(primary_key=True)
    namespace = models.TextField()
    job = models.TextField()
    scheduled_at = models.DateTimeField("tick")
    replica_id = models.TextField("replica")
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    outcome = models.TextField(null=True)
    error = models.TextField(null=True)
    manual = models.BooleanField()
    #: A range of missed ticks (past the enumeration bound): its last tick, and how many
    #: ticks the row stands for (1 for a tick's own row).
    scheduled_through = models.DateTimeField("through tick", null=True)
    ticks = models.IntegerField()

    objects = _InNamespace()

    class Meta:
        managed = False
        db_table = "replicron_runs"
        ordering = ("-run_id",)

    def __str__(self) -> str:
        return f"{self.job} at {self.scheduled_at.isoformat()}"


class Replica(models.Model):
    """A replica as the others see it (``replicron_replicas``)."""

    replica_id = models.TextField(primary_key=True)
    namespace = models.TextField()
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True)
    coordination = models.TextField(null=True)

    objects = _InNamespace()

    class Meta:
        managed = False
        db_table = "replicron_replicas"
        ordering = ("replica_id",)

    def __str__(self) -> str:
        return str(self.replica_id)
