"""The example project's settings with the changes a test names in its environment:
REPLICRON_OVERRIDE (JSON merged into REPLICRON) and SQLITE_DATABASE (DATABASES["default"]
on SQLite in that file)."""

from __future__ import annotations

import json
import os

from mysite.settings import *  # type: ignore[import-not-found]  # noqa: F403
from mysite.settings import REPLICRON as _EXAMPLE

REPLICRON = {**_EXAMPLE, **json.loads(os.environ.get("REPLICRON_OVERRIDE", "{}"))}
if os.environ.get("SQLITE_DATABASE"):
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SQLITE_DATABASE"]}
    }
