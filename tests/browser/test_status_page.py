"""The status page in a real browser, served over real HTTP, showing a real state directory:
what a person reads on it, on a desktop and on a phone.

The scenario (``tests/browser/replica.py``, a replica process): a scheduler on an embedded
state directory with two jobs. ``nightly-report`` runs once and fails; ``hourly-sync``'s next
tick comes after the replica exited, so nobody runs it and, once its grace has passed, it is
overdue.

Set ``REPLICRON_SCREENSHOT=1`` to write ``docs/img/status_page.png`` from the desktop view.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from replicron import EmbeddedBackend
from replicron.cluster import ClusterStatus
from replicron.web import status_app
from tests._harness.processes import Processes
from tests.browser.conftest import Serve
from tests.browser.replica import FAILING, LATE, REPLICA, SECRET
from tests.helpers import REPO, poll_until

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCREENSHOT = REPO / "docs" / "img" / "status_page.png"
#: How long after its tick a job without a run for it is overdue, for LATE.
GRACE = timedelta(seconds=1)
#: LATE's first tick, from the scenario's start: long enough for the replica to start, run
#: and record FAILING, and stop before it.
LATE_AFTER = timedelta(seconds=6)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory whose one replica has gone: FAILING failed, LATE is overdue."""
    state = tmp_path_factory.mktemp("status-page") / "state"
    # LATE's tick, in whole seconds as its cron schedule has them.
    tick = (datetime.now(UTC) + LATE_AFTER).replace(microsecond=0) + timedelta(seconds=1)
    processes = Processes(state.parent)
    try:
        replica = processes.spawn(
            "replica",
            [
                sys.executable,
                "-m",
                "tests.browser.replica",
                "--state-dir",
                str(state),
                "--tick",
                tick.isoformat(),
                "--grace",
                str(GRACE.total_seconds()),
            ],
        )
        assert replica.wait_exit(60) == 0, replica.log()
    finally:
        processes.close()
    assert datetime.now(UTC) < tick, "the replica outlived the overdue job's tick"
    # The tick plus its grace has to pass in real time: nothing to wait on but the clock.
    poll_until(f"{LATE} to be overdue", lambda: overdue(state), timeout=30)
    return state


def overdue(state: Path) -> bool:
    view = asyncio.run(EmbeddedBackend(state).cluster_status()).job(LATE)
    return view is not None and view.overdue


def test_a_failed_and_an_overdue_job_read_as_such(
    state_dir: Path, serve: Serve, browser: webdriver.Chrome
) -> None:
    url = serve(status_app(EmbeddedBackend(state_dir), refresh=30))
    browser.get(url + "/")
    assert browser.title == "(2) replicron"
    assert SECRET not in browser.page_source

    problems = browser.find_element(By.CSS_SELECTOR, ".problems").text
    assert "Problems (2)" in problems.replace("PROBLEMS", "Problems")
    assert f"{FAILING}: last run failed" in problems
    assert "report store unreachable: postgresql://report:***@db.internal:5432/reports" in (
        problems
    )
    assert f"{LATE}: overdue: the tick due at" in problems

    failing = job_row(browser, FAILING)
    assert "FAILED" in failing.text
    assert "failed" in failing.text  # the last run's outcome
    assert "ConnectionError: report store unreachable" in failing.text
    assert "postgresql://report:***@db.internal:5432/reports" in failing.text
    assert f"on {REPLICA}" in failing.text
    assert "OVERDUE" not in failing.text
    assert "bad" in (failing.get_attribute("class") or "")

    late = job_row(browser, LATE)
    assert "OVERDUE" in late.text
    assert "has no run" in late.text
    assert "cron(" in late.text  # the trigger as registered
    assert "FAILED" not in late.text
    assert "warn" in (late.get_attribute("class") or "")
    # Jobs to act on come first: the failed one, then the overdue one.
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.jobs .job")]
    assert names == [FAILING, LATE]

    # Its process exited: no replica is alive, and the departed one is folded away.
    section = browser.find_element(By.CSS_SELECTOR, "details.departed")
    assert "REPLICAS (0 ALIVE, 1 DEPARTED)" in browser.page_source.upper()
    assert REPLICA not in section.text
    section.find_element(By.TAG_NAME, "summary").click()
    replicas = section.find_element(By.CSS_SELECTOR, "table.replicas").text
    assert REPLICA in replicas
    assert "GONE" in replicas
    assert f"{LATE}, {FAILING}" in replicas

    if os.environ.get("REPLICRON_SCREENSHOT") == "1":
        save_screenshot(browser, width=1280)


def test_the_page_fits_a_phone(state_dir: Path, serve: Serve, browser: webdriver.Chrome) -> None:
    url = serve(status_app(EmbeddedBackend(state_dir)))
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 390, "height": 844, "deviceScaleFactor": 3, "mobile": True},
    )
    browser.get(url + "/")
    inner = browser.execute_script("return window.innerWidth")
    assert inner == 390
    scroll = browser.execute_script("return document.scrollingElement.scrollWidth")
    assert scroll <= inner, f"the page is {scroll} px wide in a {inner} px viewport"
    for name in (FAILING, LATE):
        cell = job_row(browser, name).find_element(By.CSS_SELECTOR, ".job")
        assert cell.is_displayed()
        assert cell.text == name
        rect = cell.rect
        assert rect["x"] >= 0
        assert rect["x"] + rect["width"] <= inner
    # The table became cards: each fact carries its own label, no header row.
    assert not browser.find_element(By.CSS_SELECTOR, "table.jobs thead").is_displayed()
    assert "OVERDUE" in job_row(browser, LATE).text
    assert "FAILED" in job_row(browser, FAILING).text


def test_mounted_in_an_app_its_json_link_follows(
    state_dir: Path, serve: Serve, browser: webdriver.Chrome
) -> None:
    url = serve(mount("/ops/jobs", status_app(EmbeddedBackend(state_dir))))
    browser.get(url + "/ops/jobs/")
    assert "OVERDUE" in job_row(browser, LATE).text
    browser.find_element(By.LINK_TEXT, "status.json").click()
    assert browser.current_url == url + "/ops/jobs/status.json"
    body = browser.find_element(By.TAG_NAME, "body").text
    assert f'"job": "{LATE}"' in body
    assert '"overdue": true' in body
    assert SECRET not in body


def test_the_page_reloads_itself(state_dir: Path, serve: Serve, browser: webdriver.Chrome) -> None:
    class Counting:
        def __init__(self) -> None:
            self.reads = 0
            self.backend = EmbeddedBackend(state_dir)

        async def cluster_status(self) -> ClusterStatus:
            self.reads += 1
            return await self.backend.cluster_status()

    source = Counting()
    url = serve(status_app(source, refresh=1))
    browser.get(url + "/")
    # Reloads happen in real time, by the browser's clock.
    poll_until("the page to reload twice", lambda: source.reads >= 3, timeout=15)
    assert "refreshes every 1 s" in browser.find_element(By.TAG_NAME, "header").text


def mount(prefix: str, app: ASGIApp) -> ASGIApp:
    """``app`` under ``prefix`` as web frameworks mount one (Starlette's ``Mount``): the path
    kept whole, the prefix added to ``root_path``; anything else 404."""

    async def outer(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "lifespan" or path == prefix or path.startswith(prefix + "/"):
            root = scope.get("root_path", "") + prefix
            await app(
                {**scope, "root_path": root} if scope["type"] != "lifespan" else scope,
                receive,
                send,
            )
            return
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return outer


def job_row(browser: webdriver.Chrome, name: str) -> WebElement:
    return browser.find_element(
        By.XPATH, f"//table[contains(@class, 'jobs')]//tr[.//div[@class='job' and text()='{name}']]"
    )


def save_screenshot(browser: webdriver.Chrome, *, width: int) -> None:
    """The whole page at ``width``: the viewport made as tall as the page."""
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
