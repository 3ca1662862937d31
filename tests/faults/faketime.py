"""Start a process with its wall clock shifted, through libfaketime.

``faketime_env("+30s")`` gives the environment for a child whose ``time.time()`` (and
``datetime.now()``, ``CLOCK_REALTIME``) runs 30 s ahead of the machine's, as on a host whose
clock is off. ``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps ``CLOCK_MONOTONIC`` real: it is the one
clock every process of the machine shares, so the suite stamps events with it and compares
them across replicas, skewed or not. Offsets are libfaketime's relative form: ``"+30s"``,
``"-10s"``, ``"+1.5s"`` (no leading ``@``, which would freeze the start instead).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from tests.faults.prereqs import libfaketime_path, unavailable

__all__ = ["faketime_env"]

_OFFSET = re.compile(r"[+-]\d+(\.\d+)?[smhd]?")


def faketime_env(offset: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) plus what shifts a child's wall clock
    by ``offset``. Skips the test (fails under CI) when libfaketime is missing."""
    if not _OFFSET.fullmatch(offset):
        raise ValueError(f"faketime offset must look like '+30s' or '-10s', not {offset!r}")
    library = libfaketime_path()
    if library is None:
        unavailable("libfaketime is not installed")
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library} {preload}".strip()
    env["FAKETIME"] = offset
    env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return env
