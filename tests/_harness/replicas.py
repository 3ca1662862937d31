"""Replica processes of one test: ``python -m tests._harness.replica`` (see there for what a
replica runs), each writing its events to ``<id>.events.jsonl`` and its log to ``<id>.log``
in the test's directory. A replica id started again after its process ended appends to the
same files (the events carry the pid)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests._harness.events import read_events
from tests._harness.processes import Child, Processes, Wrap

__all__ = ["Replicas", "replica_command"]


def replica_command(replica_id: str, events: Path, options: Mapping[str, object]) -> list[str]:
    """The command line of a replica: ``every_s=1`` is ``--every-s 1``, ``flag=True`` is
    ``--flag``; options that are None or False are left out (the replica's defaults)."""
    command = [
        sys.executable,
        "-m",
        "tests._harness.replica",
        "--replica-id",
        replica_id,
        "--events",
        str(events),
    ]
    for name, value in options.items():
        if value is None or value is False:
            continue
        command.append(f"--{name.replace('_', '-')}")
        if value is not True:
            command.append(str(value))
    return command


class Replicas(Processes):
    """Starts replicas, reads what they report and waits for them to be ready (each suite's
    subclass has the ``start`` and ``wait_ready`` its tests use)."""

    def spawn_replica(
        self,
        replica_id: str,
        options: Mapping[str, object],
        *,
        wrap: Wrap | None = None,
        env: Mapping[str, str] | None = None,
        where: str = "direct",
    ) -> Child:
        """Start replica ``replica_id`` with ``options`` (see :func:`replica_command`),
        its command line passed through ``wrap`` (into a network namespace, say). Does not
        wait for it: see :meth:`ready_events`."""
        command = replica_command(replica_id, self.events_path(replica_id), options)
        return self.spawn(replica_id, command, wrap=wrap, env=env, where=where)

    def events_path(self, replica_id: str) -> Path:
        return self.workdir / f"{replica_id}.events.jsonl"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every event so far of every replica (of kind ``kind``), in monotonic order."""
        paths = sorted({self.events_path(child.name) for child in self.children})
        return [e for e in read_events(paths) if kind is None or e["event"] == kind]

    def ready_events(
        self, replica_ids: Iterable[str], timeout: float = 30.0
    ) -> dict[str, dict[str, Any]]:
        """Wait until each replica's current process has started its scheduler; return each
        one's "ready" event. Fails at once on a replica that could not start."""
        pids = {self.current[replica_id].pid: replica_id for replica_id in replica_ids}

        def ready() -> dict[str, dict[str, Any]] | None:
            found = {}
            for event in self.events():
                replica_id = pids.get(event["pid"])
                if replica_id is None:
                    continue
                if event["event"] == "failed":
                    raise AssertionError(f"replica {replica_id} failed: {event['error']}")
                if event["event"] == "ready":
                    found[replica_id] = event
            return found if len(found) == len(pids) else None

        return self.wait_until(f"replicas {sorted(pids.values())} to be ready", ready, timeout)

    def stopped(self, child: Child) -> dict[str, Any] | None:
        """The "stopped" event of a process, if it wrote one."""
        found = [
            e
            for e in read_events([self.events_path(child.name)])
            if e["event"] == "stopped" and e["pid"] == child.pid
        ]
        return found[-1] if found else None
