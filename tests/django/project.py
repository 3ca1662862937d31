"""The example project (examples/django) as the tests drive it: real ``manage.py``
processes on a fresh PostgreSQL database each, so no Django settings leak between tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests.helpers import REPO, fresh_database

PROJECT = REPO / "examples" / "django"
ADMIN_CLIENT = Path(__file__).with_name("admin_client.py")


def database_url(conninfo: str) -> str:
    """A libpq connection string as the URL the example's settings read."""
    params = conninfo_to_dict(conninfo)
    user = quote(str(params.get("user", "")))
    password = params.get("password")
    auth = f"{user}:{quote(str(password))}@" if password else f"{user}@"
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    return f"postgresql://{auth}{host}:{port}/{params['dbname']}"


class Project:
    def __init__(self, conninfo: str, env: Mapping[str, str] = ()) -> None:  # type: ignore[assignment]
        self.conninfo = conninfo
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(conninfo),
            "DJANGO_SETTINGS_MODULE": "mysite.settings",
            "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO)]),
            **dict(env),
        }
        self.env.pop("PYTEST_CURRENT_TEST", None)  # the project's processes are no test run

    def manage(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def admin(self, *args: str, **env: str) -> Any:
        """What ``admin_client.py ARGS`` saw, through Django's test client."""
        done = subprocess.run(
            [sys.executable, str(ADMIN_CLIENT), *args],
            cwd=PROJECT,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    def sql(self, query: str, params: Any = ()) -> list[Any]:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cursor = conn.execute(query.encode(), params)
            return cursor.fetchall() if cursor.description else []


def fresh_project(**env: str) -> Iterator[Project]:
    with fresh_database("replicron_django") as conninfo:
        yield Project(conninfo, env)
