"""The result of ``locked_run`` / ``alocked_run``, shared by both flavours."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["LockedRun"]


class LockedRun(NamedTuple):
    """Whether the function ran (``False``: another holder had the lock) and its value."""

    ran: bool
    value: Any = None
