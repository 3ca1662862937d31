"""``misfire_grace`` in real time, on the system clock (where a run reads its start from Unix
time on its thread): one worker thread held 3 s by another job, a per-second job with a grace
of 0.5 s. No run of it starts later than the grace; the ticks that waited are recorded
missed; the job runs again once the thread is free."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from replicron import Outcome, Scheduler, current_run, every
from tests.helpers import Recorder

pytestmark = pytest.mark.timeout(60)


def test_no_start_later_than_the_grace_while_the_thread_is_held() -> None:
    recorder = Recorder()
    lateness: list[timedelta] = []
    blocker_started, blocker_may_end = threading.Event(), threading.Event()

    def blocker() -> None:
        blocker_started.set()
        blocker_may_end.wait(3)

    def per_second() -> None:
        run = current_run()
        lateness.append(datetime.now(run.scheduled_at.tzinfo) - run.scheduled_at)

    with Scheduler(max_workers=1, listeners=[recorder]) as s:
        s.add_job(every(seconds=1), per_second, name="per_second", misfire_grace=0.5)
        recorder.wait_count("after_success", 1, job="per_second")
        s.add_job(every(hours=1), blocker, name="blocker").run_now()
        assert blocker_started.wait(10)
        missed = recorder.wait_count("on_missed", 1, job="per_second")
        blocker_may_end.set()
        ran = len(recorder.of("after_success", "per_second"))
        recorder.wait_count("after_success", ran + 2, job="per_second")
    assert lateness
    assert max(lateness) <= timedelta(seconds=0.5)
    assert {e.outcome for e in missed} == {Outcome.MISSED}
    assert "past misfire_grace 0:00:00.500000" in (missed[0].detail or "")
