"""The app's scheduled jobs, found by replicron like admin.py by the admin."""

import os
from datetime import timedelta

from django.utils import timezone

from replicron import cron, current_run, every
from replicron.contrib.django import job

from .models import Beat

HEARTBEAT_SECONDS = float(os.environ.get("EXAMPLE_HEARTBEAT_SECONDS", "60"))


@job(every(seconds=HEARTBEAT_SECONDS), name="heartbeat")
def heartbeat() -> None:
    """Writes a row per run: the ORM in a worker thread, its connection kept fresh."""
    run = current_run()
    Beat.objects.create(tick=run.scheduled_at, replica=run.replica_id)


@job(cron("0 3 * * *"), name="nightly-cleanup", timeout=timedelta(minutes=30))
def nightly_cleanup() -> None:
    Beat.objects.filter(created__lt=timezone.now() - timedelta(days=7)).delete()


if os.environ.get("EXAMPLE_BROKEN_JOB") == "1":  # for the tests of `replicron check`

    @job(every(minutes=5), name="broken", timeout=-1)
    def broken() -> None:
        pass
