"""replicron's migrations again: the function that reads the jobs' advisory locks came with
one. A project migrated before it gets it from ``manage.py migrate``, also when its replicas
run with ``"migrate": False``."""

from __future__ import annotations

from django.db import migrations

from ._apply import apply_replicron_migrations

__all__ = ["Migration"]


class Migration(migrations.Migration):
    # replicron's migrations run in a transaction of their own, on a connection of their own.
    atomic = False
    dependencies = [("replicron", "0002_missed_ranges")]

    operations = [
        migrations.RunPython(apply_replicron_migrations, migrations.RunPython.noop),
    ]
