"""What a suite needs from the machine (a browser, root, pgbouncer, ...): without it the tests
skip with the reason, but under CI (``CI`` set) they fail, so that a broken CI image cannot
silently turn a suite into a row of skips."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["in_ci", "unavailable"]


def in_ci() -> bool:
    """True under CI, where a missing prerequisite is a failure, never a skip."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(message: str) -> NoReturn:
    """Skip the test for the reason ``message`` says, or fail it under CI."""
    if in_ci():
        pytest.fail(f"{message} (CI is set: these tests must not be skipped)", pytrace=False)
    pytest.skip(message)
