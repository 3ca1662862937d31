"""The example project's settings with the changes a test names in its environment:
REPLICRON_OVERRIDE (JSON merged into REPLICRON), EXTRA_INSTALLED_APPS (a JSON list of apps
added to INSTALLED_APPS) and SQLITE_DATABASE (DATABASES["default"] on SQLite in that file)."""

from __future__ import annotations

import json
import os

from mysite.settings import *  # type: ignore[import-not-found]  # noqa: F403
from mysite.settings import INSTALLED_APPS as _EXAMPLE_APPS
from mysite.settings import REPLICRON as _EXAMPLE

REPLICRON = {**_EXAMPLE, **json.loads(os.environ.get("REPLICRON_OVERRIDE", "{}"))}
INSTALLED_APPS = [*_EXAMPLE_APPS, *json.loads(os.environ.get("EXTRA_INSTALLED_APPS", "[]"))]
if os.environ.get("SQLITE_DATABASE"):
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SQLITE_DATABASE"]}
    }
