"""catch_up="all": the backlog of ticks caught up on start is claimed in the ledger as it is
found, so a stop in the middle of it leaves every tick of the gap with exactly one record:
the ticks that ran, the one cut off, and the rest recorded missed."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from replicron import EmbeddedBackend, Outcome, Scheduler, every
from replicron.context import current_run
from tests.helpers import Gate, Recorder, embedded_rows, ran_once_then_down

SECOND = timedelta(seconds=1)
GAP = timedelta(minutes=10)


def an_hour_ago() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def one_record_each(state_dir: Path, first_tick: datetime) -> list[dict[str, object]]:
    """The rows of the job, once each tick of the gap is known to have exactly one, all
    finished."""
    rows = embedded_rows(state_dir, "fast")
    per_tick = Counter(row["scheduled_at"] for row in rows)
    gap = [first_tick + k * SECOND for k in range(GAP // SECOND + 1)]
    assert [tick for tick in gap if per_tick[tick] != 1] == []
    assert all(row["outcome"] is not None for row in rows)
    return rows


def test_a_stop_in_the_middle_of_a_backlog_leaves_every_tick_of_the_gap_one_record(
    tmp_path: Path,
) -> None:
    clock, first_tick = ran_once_then_down(tmp_path, an_hour_ago(), GAP)
    gate = Gate()
    gate.release.set()

    def until_told_to_stop() -> None:
        gate()
        current_run().cancelled.wait(10)

    second = Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path))
    second.add_job(every(seconds=1), until_told_to_stop, name="fast", catch_up="all")
    second.start()
    gate.wait_started(1)  # the backlog's first tick runs; 599 more wait behind it
    second.shutdown(wait=False)

    rows = one_record_each(tmp_path, first_tick)
    waited = [row for row in rows if row["scheduled_at"] > gate.started[0]]  # type: ignore[operator]
    assert len(waited) == GAP // SECOND - 1
    assert {(row["outcome"], row["error"]) for row in waited} == {
        (Outcome.MISSED.value, "scheduler shut down first")
    }


def test_a_job_removed_in_the_middle_of_its_backlog_runs_no_more_of_it(tmp_path: Path) -> None:
    clock, first_tick = ran_once_then_down(tmp_path, an_hour_ago(), GAP)
    gate = Gate()
    recorder = Recorder()
    with Scheduler(clock=clock, backend=EmbeddedBackend(tmp_path)) as second:
        second.add_listener(recorder)
        second.add_job(every(seconds=1), gate, name="fast", catch_up="all")
        gate.wait_started(1)
        second.remove_job("fast")
        gate.release.set()
        recorder.wait_count("on_missed", GAP // SECOND - 1)
        second.wait_idle()
    assert len(gate.started) == 1
    rows = one_record_each(tmp_path, first_tick)
    waited = [row for row in rows if row["scheduled_at"] > gate.started[0]]  # type: ignore[operator]
    assert {(row["outcome"], row["error"]) for row in waited} == {
        (Outcome.MISSED.value, "the job was removed before its turn")
    }
