"""replicron's tables, made by replicron's own numbered migrations (the same ones
``replicron migrate`` and a starting PostgresBackend apply, recorded in
``replicron_migrations``), on the database ``settings.REPLICRON["database"]`` names; then the
read-only models the admin shows over them. With another backend there is nothing to make:
the embedded backend keeps its ledger in its state directory."""

from __future__ import annotations

from django.db import migrations, models

from ._apply import apply_replicron_migrations

__all__ = ["Migration"]


class Migration(migrations.Migration):
    initial = True
    # replicron's migrations run in a transaction of their own, on a connection of their own.
    atomic = False
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(apply_replicron_migrations, migrations.RunPython.noop),
        migrations.CreateModel(
            name="RegisteredJob",
            fields=[
                ("job", models.TextField(primary_key=True, serialize=False)),
                ("namespace", models.TextField()),
                ("replica_id", models.TextField(verbose_name="registered by")),
                ("trigger", models.TextField()),
                ("fingerprint", models.TextField(verbose_name="definition")),
                ("last_seen", models.DateTimeField()),
            ],
            options={
                "verbose_name": "job",
                "db_table": "replicron_jobs",
                "ordering": ("job", "-last_seen"),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Replica",
            fields=[
                ("replica_id", models.TextField(primary_key=True, serialize=False)),
                ("namespace", models.TextField()),
                ("started_at", models.DateTimeField()),
                ("last_seen", models.DateTimeField()),
                ("stopped_at", models.DateTimeField(null=True)),
                ("coordination", models.TextField(null=True)),
            ],
            options={
                "db_table": "replicron_replicas",
                "ordering": ("replica_id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("run_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("namespace", models.TextField()),
                ("job", models.TextField()),
                ("scheduled_at", models.DateTimeField(verbose_name="tick")),
                ("replica_id", models.TextField(verbose_name="replica")),
                ("started_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField(null=True)),
                ("outcome", models.TextField(null=True)),
                ("error", models.TextField(null=True)),
                ("manual", models.BooleanField()),
            ],
            options={
                "db_table": "replicron_runs",
                "ordering": ("-run_id",),
                "managed": False,
            },
        ),
    ]
