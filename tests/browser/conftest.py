"""Fixtures for the browser tests: a real HTTP server (uvicorn, on a thread of the test
process) serving an ASGI app, and a real headless Chromium driven through the system's
chromedriver.

Chromium and chromedriver come from Debian's ``chromium`` and ``chromium-driver`` packages
(.ci/run installs them). Without them the tests skip; under CI (``CI`` set) they fail, so
that a broken CI image cannot turn them into skips.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests._harness.machine import unavailable
from tests.helpers import poll_until

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

Serve = Callable[[Any], str]


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    """A headless Chromium at a desktop size; tests resize it as they need."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        unavailable(
            f"browser tests need {' and '.join(missing)} (apt-get install chromium chromium-driver)"
        )
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",  # a container's /dev/shm is often too small
        "--window-size=1440,1000",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
        "--force-prefers-color-scheme=light",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(app)`` serves the ASGI app over HTTP on a free local port until the test
    ends, and returns its base URL."""
    with contextlib.ExitStack() as stack:

        def start(app: Any) -> str:
            return stack.enter_context(_serving(app))

        yield start


@contextlib.contextmanager
def _serving(app: Any) -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="browser-test-http", daemon=True
    )
    thread.start()
    try:
        poll_until(
            "the HTTP server to start",
            lambda: server.started,
            timeout=20,
            before_each=lambda: _alive(thread),
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        assert not thread.is_alive(), "the HTTP server did not stop"


def _alive(thread: threading.Thread) -> None:
    if not thread.is_alive():
        raise AssertionError("the HTTP server's thread died before it started")
