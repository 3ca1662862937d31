"""replicron's migrations again: the max_runs count changed with one (a run whose replica
died counts at once). A project migrated before it gets it from ``manage.py migrate``, also
when its replicas run with ``"migrate": False``."""

from __future__ import annotations

from django.db import migrations

from ._apply import apply_replicron_migrations

__all__ = ["Migration"]


class Migration(migrations.Migration):
    # replicron's migrations run in a transaction of their own, on a connection of their own.
    atomic = False
    dependencies = [("replicron", "0003_advisory_locks")]

    operations = [
        migrations.RunPython(apply_replicron_migrations, migrations.RunPython.noop),
    ]
