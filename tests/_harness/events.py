"""What a replica process reports: one JSON object per line in its events file.

Every line is written with one ``write`` to a file opened with ``O_APPEND``, so lines of
different threads (and of the processes a replica id had in turn) never interleave, and a
process killed mid-write leaves at most a torn last line, which readers pass over. Each event
carries ``event``, ``replica``, ``pid``, ``mono`` (``time.monotonic()``: one clock for every
process of the machine, network namespaces included, never shifted by libfaketime) and
``wall`` (``time.time()``: the process's own idea of the time, shifted under libfaketime).

The events: ``ready`` (the scheduler runs; ``metrics_port`` when it serves metrics),
``start`` and ``finish`` of each run (``job``, ``tick`` as ISO-8601, ``run_id``; ``finish``
adds ``cancelled``), ``failed`` (the scheduler did not start: ``error``), ``stopping``
(SIGTERM came) and ``stopped`` (``shutdown()`` returned).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "read_events"]


class EventLog:
    """Appends one JSON line per event to a file shared safely by threads (and processes)."""

    def __init__(self, path: Path, replica_id: str) -> None:
        self.replica_id = replica_id
        self.pid = os.getpid()
        # Never closed: a task thread may still write after shutdown() gave up on it, and
        # the process's exit closes it anyway.
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: Any) -> None:
        record = {
            "event": event,
            "replica": self.replica_id,
            "pid": self.pid,
            "mono": time.monotonic(),
            "wall": time.time(),
            **fields,
        }
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        os.write(self._fd, line)  # one write: O_APPEND keeps the line whole


def read_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every whole event of the given files, in monotonic order."""
    events = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines(keepends=True):
            if not line.endswith("\n"):
                continue  # being written, or torn by a kill
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(events, key=lambda e: float(e["mono"]))
