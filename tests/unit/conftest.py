"""Fixtures several unit test files share: a fake clock at :data:`tests.helpers.START`, a
:class:`~tests.helpers.Recorder`, and a started Scheduler on both (replica ``r1``). A file
that needs another kind of scheduler defines its own ``scheduler`` fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from replicron import Scheduler
from replicron.testing import FakeClock
from tests.helpers import START, Recorder


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def scheduler(clock: FakeClock, recorder: Recorder) -> Iterator[Scheduler]:
    s = Scheduler(clock=clock, listeners=[recorder], replica_id="r1")
    s.start()
    yield s
    s.shutdown()
