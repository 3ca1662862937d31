"""Shared fixtures: every test must leave no replicron thread running, and the garbage
collector enabled and not held back (schedulers with defer_gc=True hold it back while an
instant's runs start).

The suites of real processes in real time (:data:`REAL_TIME`) are marked ``slow``, so that
``-m "not slow"`` is the fast tier; tests/faults is also marked ``faults``. A failed test's
report shows the logs of its processes (:mod:`tests._harness.reporting`), and the scenarios'
summary lines are printed at the end of the run, a section per suite ("acceptance summary").
Any suite may start daemon processes (``daemons``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._harness.daemons import Daemons, daemons_of_test
from tests._harness.reporting import FAILURE_SECTIONS
from tests.helpers import summary_recorder

TESTS = Path(__file__).resolve().parent
#: The folders of tests that run real processes in real time, and their markers.
REAL_TIME = {"acceptance": ("slow",), "browser": ("slow",), "faults": ("slow", "faults")}
#: The name of the user property that carries a summary line in a test's report.
SUMMARY_PROPERTY = "replicron summary"


def suite_of(path: Path) -> str:
    """The folder under tests/ that a test file is in ("" for one outside)."""
    resolved = Path(path).resolve()
    if TESTS not in resolved.parents:
        return ""
    parts = resolved.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else ""


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in REAL_TIME.get(suite_of(item.path), ()):
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture
def summary(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a scenario's summary line: printed now (captured) and at the end of the run,
    in its suite's section. The line travels in the test's report, so that a test run in a
    worker process (``-n``) has it printed by the process that reports."""
    section = f"{suite_of(request.path)} summary"
    record = summary_recorder([])
    callspec = getattr(request.node, "callspec", None)
    mode = None if callspec is None else callspec.params.get("coordination")
    prefix = "" if mode is None else f"({mode} mode) "  # a test run in both modes says which

    def add(line: str) -> None:
        record(prefix + line)
        request.node.user_properties.append((SUMMARY_PROPERTY, (section, prefix + line)))

    return add


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        for title, text in item.stash.get(FAILURE_SECTIONS, []):
            if shown := text():
                report.sections.append((title, shown))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    sections: dict[str, list[str]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in report.user_properties:
                if name == SUMMARY_PROPERTY:
                    section, line = value
                    sections.setdefault(section, []).append(line)
    for section, lines in sections.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith("replicron-") and t.is_alive()
    ]
    for thread in leaked:
        thread.join(timeout=5)  # a worker finishing the task it was given at shutdown
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"threads left running: {still}"


@pytest.fixture(autouse=True)
def collector_enabled_after() -> Iterator[None]:
    yield
    from replicron._engine.collector import holding

    if not gc.isenabled() or holding():
        gc.enable()  # so that the tests after this one are not affected
        gc.set_threshold(700, 10, 10)
        pytest.fail("the test left the garbage collector disabled or held back")


@pytest.fixture
def daemon_host() -> type[Daemons]:
    """The kind of host the ``daemons`` fixture makes (a module may ask for a subclass)."""
    return Daemons


@pytest.fixture
def daemons(
    request: pytest.FixtureRequest, tmp_path: Path, daemon_host: type[Daemons]
) -> Iterator[Daemons]:
    """Daemon processes of the test, their logs attached to its report if it fails."""
    with daemons_of_test(request, daemon_host(tmp_path)) as host:
        yield host
