"""Daemons of one test: real ``python -m replicron run CONFIG`` processes, each on a TOML
config of its own, ``<name>.toml`` in the test's directory (which is also where they run),
with the environment's REPLICRON_* settings left out (they would override the configs)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from tests._harness.processes import Child, Processes, Wrap, clean_env
from tests._harness.reporting import report_on_failure

__all__ = ["Daemons", "config_text", "daemons_of_test", "toml"]


def toml(value: object) -> str:
    """``value`` as a TOML value (strings as basic strings: JSON's escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def config_text(scheduler: Mapping[str, object], jobs: Sequence[Mapping[str, object]]) -> str:
    """A daemon config: the ``[scheduler]`` table and one ``[[job]]`` per job."""
    lines = ["[scheduler]", *(f"{key} = {toml(value)}" for key, value in scheduler.items())]
    for job in jobs:
        lines += ["", "[[job]]", *(f"{key} = {toml(value)}" for key, value in job.items())]
    return "\n".join(lines) + "\n"


class Daemons(Processes):
    """Starts daemons on configs of their own; watched and stopped as any process."""

    def config_path(self, name: str) -> Path:
        return self.workdir / f"{name}.toml"

    def write_config(self, name: str, text: str) -> Path:
        path = self.config_path(name)
        path.write_text(text)
        return path

    def start(
        self,
        name: str,
        config: str,
        *,
        wrap: Wrap | None = None,
        where: str = "direct",
    ) -> Child:
        """Write ``config`` to ``<name>.toml`` and start ``python -m replicron run`` on it,
        its command line passed through ``wrap`` (into a network namespace, say); does not
        wait for it to be ready."""
        command = [sys.executable, "-m", "replicron", "run", str(self.write_config(name, config))]
        return self.spawn(name, command, wrap=wrap, env=clean_env(), cwd=self.workdir, where=where)


D = TypeVar("D", bound=Daemons)


@contextlib.contextmanager
def daemons_of_test(request: pytest.FixtureRequest, host: D) -> Iterator[D]:
    """``host``'s daemons for one test: their logs in its report if it fails, every one
    still running stopped at the end."""
    report_on_failure(request, "daemon logs", host.logs)
    try:
        yield host
    finally:
        host.close()
