"""``misfire_grace`` and ``max_runs`` on PostgreSQL, where the ledger counts the runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pytest

from replicron import Scheduler
from replicron.postgres import PostgresBackend
from replicron.testing import FakeClock
from tests.helpers import Recorder
from tests.unit.conftest import clock, recorder
from tests.unit.test_misfire_grace import make, max_runs_while_ticking

__all__ = ["clock", "make", "recorder"]  # the fixtures


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_a_run_missed_on_its_thread_does_not_use_up_max_runs_while_the_job_ticks(
    make: Callable[..., Scheduler], clock: FakeClock, recorder: Recorder, dsn: str,
    coordination: Literal["advisory", "lease"],
) -> None:  # fmt: skip
    backend = PostgresBackend(dsn, coordination=coordination, heartbeat_interval=0.5)
    s = make(clock=clock, listeners=[recorder], max_workers=1, backend=backend)
    max_runs_while_ticking(s, clock, recorder, shared=True)
