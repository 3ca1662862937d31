"""What a failed test shows besides its traceback: the logs of its processes and whatever
else a fixture asks for (``tests/conftest.py`` attaches them to the report)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

__all__ = ["FAILURE_SECTIONS", "report_on_failure"]

#: (title, text) of the sections a failed test's report gets; text is read at the failure.
FAILURE_SECTIONS = pytest.StashKey[list[tuple[str, Callable[[], str]]]]()


def report_on_failure(request: pytest.FixtureRequest, title: str, text: Callable[[], str]) -> None:
    """Add the section ``title`` to the report of the test if it fails (left out when
    ``text()`` is empty then)."""
    request.node.stash.setdefault(FAILURE_SECTIONS, []).append((title, text))
