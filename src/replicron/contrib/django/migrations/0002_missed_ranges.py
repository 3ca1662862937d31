"""replicron's migrations again (the ledger's ranges of missed ticks came with one), and the
two columns they added to the read-only ``Run`` model."""

from __future__ import annotations

from django.db import migrations, models

from ._apply import apply_replicron_migrations

__all__ = ["Migration"]


class Migration(migrations.Migration):
    # replicron's migrations run in a transaction of their own, on a connection of their own.
    atomic = False
    dependencies = [("replicron", "0001_initial")]

    operations = [
        migrations.RunPython(apply_replicron_migrations, migrations.RunPython.noop),
        migrations.AddField(
            model_name="run",
            name="scheduled_through",
            field=models.DateTimeField(null=True, verbose_name="through tick"),
        ),
        migrations.AddField(
            model_name="run",
            name="ticks",
            field=models.IntegerField(default=1),
            preserve_default=False,
        ),
    ]
