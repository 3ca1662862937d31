"""replicron's own numbered migrations, run from Django's (``manage.py migrate``). Not a
migration itself: Django's loader skips modules whose name starts with an underscore."""

from __future__ import annotations

from typing import Any

__all__ = ["apply_replicron_migrations"]


def apply_replicron_migrations(apps: Any, schema_editor: Any) -> None:
    """Apply those not applied yet to the database ``settings.REPLICRON["database"]`` names
    (with another backend, or on another database alias, nothing)."""
    from asgiref.sync import async_to_sync

    from replicron.contrib.django.conf import conninfo_of_alias, read_settings
    from replicron.postgres import migrate

    settings = read_settings()
    if settings.backend != "postgres" or schema_editor.connection.alias != settings.database:
        return
    async_to_sync(migrate)(conninfo_of_alias(settings.database))
