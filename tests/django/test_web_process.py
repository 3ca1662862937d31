"""When the scheduler runs inside the web server's processes: with ``run_in_web_process``
on the first request a serving process handles (never under ``migrate``, ``shell`` or
runserver's autoreloader parent), and for an ASGI server's lifespan with
``ReplicronLifespan`` (uvicorn, a real server)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from tests.django.project import PROJECT, Project, fresh_project
from tests.helpers import poll_until

pytestmark = pytest.mark.timeout(300)


CASES = [
    (["manage.py", "migrate"], {}, "a management command (migrate)"),
    (["manage.py", "shell"], {}, "a management command (shell)"),
    (["manage.py", "test"], {}, "a management command (test)"),
    (["/srv/django-admin", "replicron", "run"], {}, "a management command (replicron)"),
    (["manage.py", "runserver"], {}, "runserver's autoreloader parent (its child serves)"),
    (["manage.py", "runserver"], {"RUN_MAIN": "true"}, None),
    (["manage.py", "runserver", "--noreload"], {}, None),
    (["/usr/bin/pytest"], {}, "a test run"),
    (["/venv/bin/gunicorn", "mysite.wsgi"], {}, None),
    (["/venv/bin/uvicorn", "mysite.asgi:application"], {}, None),
]


def test_where_the_web_process_may_run_the_scheduler() -> None:
    # In a process of its own: Django stays out of the test process.
    code = (
        "import json, sys; from replicron.contrib.django.runtime import web_process_refusal; "
        "print(json.dumps([web_process_refusal(a, e) for a, e in json.load(sys.stdin)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([[a, e] for a, e, _ in CASES]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == [refused for *_, refused in CASES]


@pytest.fixture
def project() -> Iterator[Project]:
    yield from fresh_project(EXAMPLE_HEARTBEAT_SECONDS="1", REPLICRON_IN_WEB_PROCESS="1")


def replicas(project: Project) -> list[tuple[str, bool]]:
    return project.sql(
        "SELECT replica_id, stopped_at IS NOT NULL FROM replicron_replicas ORDER BY 1"
    )


def test_management_commands_never_start_it_a_serving_process_does(project: Project) -> None:
    assert project.manage("migrate", "--noinput").returncode == 0
    served = "from django.test import Client; print(Client().get('/admin/login/').status_code)"
    shell = project.manage("shell", "-c", served)
    assert shell.stdout.splitlines()[-1] == "200", shell.stderr
    assert replicas(project) == []  # neither migrate nor a request under shell started it

    assert project.admin("get", "/admin/") == {"status": 200}
    [(_, stopped)] = replicas(project)
    assert stopped  # started by the request, stopped as the process exited


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_runserver_runs_it_in_the_serving_child_only(project: Project) -> None:
    assert project.manage("migrate", "--noinput").returncode == 0
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}"],
        cwd=PROJECT,
        env=project.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/admin/login/"
        poll_until("runserver", lambda: _answers(url), 60, every=0.2)
        [(replica, _)] = poll_until("the replica", lambda: replicas(project) or None, 30)
        pid = int(replica.rsplit(":", 1)[1])
        assert pid != server.pid  # the autoreloader's child, which serves
        started = "SELECT count(*) FROM replicron_runs WHERE outcome = 'succeeded'"
        poll_until("a heartbeat", lambda: project.sql(started)[0][0] >= 1, 30)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_an_asgi_server_runs_it_for_its_lifespan(project: Project) -> None:
    assert project.manage("migrate", "--noinput").returncode == 0
    port = free_port()
    env = {**project.env, "REPLICRON_IN_WEB_PROCESS": ""}  # the lifespan alone starts it
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "mysite.asgi:application",
            "--port",
            str(port),
            "--lifespan",
            "on",
        ],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Started at the lifespan's startup, before any request.
        [(replica, stopped)] = poll_until("the replica", lambda: replicas(project) or None, 60)
        assert not stopped
        assert replica.endswith(f":{server.pid}")
        assert _answers_eventually(f"http://127.0.0.1:{port}/admin/login/")
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    # uvicorn stops gracefully, then ends by the signal it was sent.
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Application shutdown complete." in err
    assert replicas(project) == [(replica, True)]  # stopped at the lifespan's shutdown


def _answers_eventually(url: str) -> bool:
    return poll_until("the server", lambda: _answers(url), 30, every=0.2)
