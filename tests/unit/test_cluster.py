"""The cluster's registry, pause and status, on the in-process backend with a fake clock,
and the pure view (overdue, drift) from what a backend read."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from replicron import MemoryBackend, MemoryState, Outcome, Scheduler, cron, every
from replicron.cluster import (
    MOST_EXPECTED,
    JobStatus,
    Pause,
    Problem,
    ProblemKind,
    Registration,
    ReplicaStatus,
    Severity,
    build_status,
)
from replicron.testing import FakeClock
from tests.helpers import START, Recorder, noop, z


def fail() -> None:
    raise RuntimeError("upstream answered 503")


@pytest.fixture
def state() -> MemoryState:
    return MemoryState()


@pytest.fixture
def replicas(clock: FakeClock, state: MemoryState) -> Iterator[list[tuple[Scheduler, Recorder]]]:
    made = []
    for name in ("r1", "r2"):
        recorder = Recorder()
        scheduler = Scheduler(
            clock=clock, backend=MemoryBackend(state), listeners=[recorder], replica_id=name
        )
        scheduler.add_job(every(seconds=10), noop, name="tick")
        made.append((scheduler, recorder))
    for scheduler, _ in made:
        scheduler.start()
    yield made
    for scheduler, _ in made:
        scheduler.shutdown()


def step(clock: FakeClock, replicas: list[tuple[Scheduler, Recorder]], to: datetime) -> None:
    assert clock.wait_for_sleepers(len(replicas))
    clock.set(to)
    for scheduler, _ in replicas:
        scheduler.wait_idle()


def outcomes(replicas: list[tuple[Scheduler, Recorder]]) -> list[tuple[datetime, Outcome]]:
    return sorted(
        (event.scheduled_at, event.outcome)
        for _, recorder in replicas
        for _, event in recorder.events
        if event.outcome is not None
    )


def test_a_paused_job_runs_nowhere_its_ticks_are_recorded_paused_and_resuming_replays_none(
    replicas: list[tuple[Scheduler, Recorder]], clock: FakeClock, state: MemoryState
) -> None:
    (first, _), (second, _) = replicas
    step(clock, replicas, START + timedelta(seconds=10))
    assert first.get_job("tick").pause() is True
    assert second.pause_job("tick") is False  # one pause for the cluster
    for seconds in (20, 30):
        step(clock, replicas, START + timedelta(seconds=seconds))
    assert second.resume_job("tick") is True
    step(clock, replicas, START + timedelta(seconds=40))
    assert outcomes(replicas) == [
        (START + timedelta(seconds=10), Outcome.SUCCEEDED),
        (START + timedelta(seconds=20), Outcome.PAUSED),
        (START + timedelta(seconds=30), Outcome.PAUSED),
        (START + timedelta(seconds=40), Outcome.SUCCEEDED),
    ]
    assert [r.outcome for r in state.history("tick")] == [
        Outcome.SUCCEEDED,
        Outcome.PAUSED,
        Outcome.PAUSED,
        Outcome.SUCCEEDED,
    ]
    assert first.get_job("tick").resume() is False


def test_resume_can_ask_for_one_run_in_place_of_the_paused_ticks(
    replicas: list[tuple[Scheduler, Recorder]], clock: FakeClock
) -> None:
    (first, _), _ = replicas
    first.pause_job("tick")
    step(clock, replicas, START + timedelta(seconds=10))
    first.get_job("tick").resume(run_now=True)
    for scheduler, _ in replicas:
        scheduler.wait_idle()
    ran = [
        (e.scheduled_at, e.outcome, e.manual)
        for _, r in replicas
        for _, e in r.events
        if e.outcome is Outcome.SUCCEEDED
    ]
    assert len(ran) == 1
    at, _, manual = ran[0]
    assert manual
    assert START + timedelta(seconds=10) <= at < START + timedelta(seconds=10.001)


def test_the_status_shows_pause_last_runs_and_who_schedules_each_job(
    replicas: list[tuple[Scheduler, Recorder]], clock: FakeClock
) -> None:
    (first, _), _ = replicas
    before = first.cluster_status().job("tick")
    assert before is not None
    assert before.next_due == START + timedelta(seconds=10)
    step(clock, replicas, START + timedelta(seconds=10))
    first.pause_job("tick")
    status = first.cluster_status()
    view = status.job("tick")
    assert view is not None
    assert view.trigger == "every 10s"
    assert view.scheduled_by == ("r1", "r2")
    assert view.last_outcome == "succeeded"
    assert view.last_scheduled_at == START + timedelta(seconds=10)
    assert view.paused is not None
    assert view.paused.paused_by == "r1"
    assert not view.drift
    assert {r.replica_id: r.jobs for r in status.replicas} == {"r1": ("tick",), "r2": ("tick",)}


def test_replicas_that_register_one_name_differently_are_warned_and_shown(
    clock: FakeClock, state: MemoryState, caplog: pytest.LogCaptureFixture
) -> None:
    old = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="old")
    new = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="new")
    old.add_job(cron("0 * * * *"), noop, name="report")
    new.add_job(cron("30 * * * *"), noop, name="report")
    with caplog.at_level(logging.WARNING, logger="replicron"):
        old.start()
        new.start()
    try:
        drift = [r.getMessage() for r in caplog.records if getattr(r, "event", "") == "drift"]
        assert len(drift) == 1
        assert "cron('0 * * * *'" in drift[0]
        assert "cron('30 * * * *'" in drift[0]
        view = new.cluster_status().job("report")
        assert view is not None
        assert sorted(r.replica_id for r in view.drift) == ["new", "old"]
        assert len({r.trigger for r in view.drift}) == 2
        assert any("definition drift" in line for line in new.cluster_status().problems())
    finally:
        old.shutdown()
        new.shutdown()


# ---- the pure view ---------------------------------------------------------------------

NOW = z(2026, 6, 1, 12)
GRACE = timedelta(minutes=1)


def registration(
    job: str, replica: str, next_due: datetime | None, *, alive: bool = True, fp: str = "a"
) -> Registration:
    expected = () if next_due is None else (next_due,)
    return Registration(job, replica, "every(minutes=5)", fp, GRACE, expected, NOW, alive)


def ledger(job: str, last_tick: datetime, outcome: str = "succeeded") -> JobStatus:
    return JobStatus(
        job, "r1", last_tick, last_tick, last_tick, outcome, None, last_tick, (), 0, (), last_tick
    )


def replica(name: str, started: datetime, alive: bool) -> ReplicaStatus:
    return ReplicaStatus(name, None, None, started, NOW, alive)


@pytest.mark.parametrize(
    ("next_due", "last_tick", "overdue"),
    [
        (NOW - timedelta(minutes=5), NOW - timedelta(minutes=10), True),  # no row since
        (NOW - timedelta(seconds=30), NOW - timedelta(minutes=10), False),  # within grace
        (NOW - timedelta(minutes=5), NOW - timedelta(minutes=5), False),  # the tick has a row
        (NOW - timedelta(minutes=5), NOW - timedelta(minutes=1), False),  # a later one has
        (None, NOW - timedelta(minutes=10), False),  # no more ticks expected
    ],
)
def test_a_job_is_overdue_when_an_expected_tick_has_no_row_past_its_grace(
    next_due: datetime | None, last_tick: datetime, overdue: bool
) -> None:
    status = build_status(
        "",
        NOW,
        [ledger("j", last_tick)],
        [registration("j", "r1", next_due, alive=False)],
        [],
        [replica("r1", NOW - timedelta(days=1), False)],
    )
    view = status.job("j")
    assert view is not None
    assert view.overdue is overdue
    assert any("overdue" in line for line in status.problems()) is overdue


def test_a_paused_job_is_never_overdue() -> None:
    status = build_status(
        "",
        NOW,
        [ledger("j", NOW - timedelta(hours=1))],
        [registration("j", "r1", NOW - timedelta(minutes=30))],
        [Pause("j", NOW - timedelta(hours=1), "ops")],
        [replica("r1", NOW, True)],
    )
    view = status.job("j")
    assert view is not None
    assert not view.overdue
    assert view.paused is not None
    assert status.problems() == []


def test_a_job_whose_replicas_are_gone_stays_overdue_whoever_else_is_up() -> None:
    """Another replica of the namespace starting, or a deploy that dropped the job: nothing
    tells these apart from a job that silently stopped, so it stays overdue, with a hint,
    until a person forgets it."""
    old = registration("gone", "old", NOW - timedelta(minutes=30), alive=False)
    rows = [ledger("gone", NOW - timedelta(hours=1))]
    others_up = build_status(
        "", NOW, rows, [old], [], [replica("new", NOW - timedelta(minutes=5), True)]
    )
    nobody_up = build_status(
        "", NOW, rows, [old], [], [replica("old", NOW - timedelta(days=1), False)]
    )
    assert [v.overdue for v in others_up.jobs] == [True]
    assert others_up.problems()[0].endswith(
        "if it was dropped on purpose, `replicron forget gone`)"
    )
    assert [v.overdue for v in nobody_up.jobs] == [True]
    assert "forget" not in nobody_up.problems()[0]


def test_the_live_replicas_expectations_are_the_ones_that_count() -> None:
    """A stopped replica's old list (an uneven cron's ticks) is no guide once a live replica
    schedules the job and runs it."""
    uneven = (NOW - timedelta(minutes=10), NOW - timedelta(minutes=9, seconds=50))
    stopped = replace(registration("j", "old", None, alive=False), expected=uneven)
    live = registration("j", "new", NOW + timedelta(seconds=10))
    rows = [ledger("j", NOW - timedelta(seconds=5))]
    status = build_status("", NOW, rows, [stopped, live], [], [replica("new", NOW, True)])
    view = status.job("j")
    assert view is not None
    assert not view.overdue
    assert view.next_due == NOW + timedelta(seconds=10)


@pytest.mark.parametrize(("length", "overdue"), [(MOST_EXPECTED, True), (3, False)])
def test_past_the_list_a_reader_extrapolates_only_a_list_cut_at_its_most(
    length: int, overdue: bool
) -> None:
    """A list cut at MOST_EXPECTED (a fast job) goes on by its spacing; a shorter one covered
    the job's horizon, and nothing past it can be told (an uneven cron, the last of
    max_runs)."""
    start = NOW - timedelta(minutes=10)
    ticks = tuple(start + timedelta(seconds=n) for n in range(length))
    gone = replace(registration("j", "r1", None, alive=False), expected=ticks)
    rows = [ledger("j", ticks[-1])]
    status = build_status("", NOW, rows, [gone], [], [replica("r1", start, False)])
    view = status.job("j")
    assert view is not None
    assert view.overdue is overdue
    if overdue:
        assert view.overdue_since == ticks[-1] + timedelta(seconds=1)


def test_problems_name_failures_drift_and_frozen_holders() -> None:
    failed = JobStatus(
        "f",
        "r1",
        NOW,
        NOW,
        NOW,
        "failed",
        "RuntimeError: boom",
        None,
        (),
        0,
        (("r2", 7),),
        NOW,
    )
    status = build_status(
        "",
        NOW,
        [failed],
        [registration("f", "r1", None), registration("f", "r2", None, fp="b")],
        [],
        [replica("r1", NOW, True), replica("r2", NOW, True)],
    )
    lines = status.problems()
    assert len(lines) == 3
    assert lines[0].startswith("f: definition drift")
    assert lines[1].startswith("f: last run failed")
    assert "RuntimeError: boom" in lines[1]
    assert "run 7 of replica r2" in lines[2]
    assert status.to_json()["problems"] == lines


def test_fail_records_a_failed_last_run(clock: FakeClock, state: MemoryState) -> None:
    scheduler = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="r1")
    scheduler.add_job(every(seconds=10), fail, name="flaky")
    scheduler.start()
    try:
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=10))
        scheduler.wait_idle()
        view = scheduler.cluster_status().job("flaky")
        assert view is not None
        assert view.last_outcome == "failed"
        assert view.last_error is not None
        assert "503" in view.last_error
    finally:
        scheduler.shutdown()


# ---- what a replica writes to the registry ---------------------------------------------


def written(state: MemoryState, replica: str) -> dict[str, tuple[datetime, ...]]:
    return {job: d.expected for (job, who), (d, _) in state.registry.items() if who == replica}


def test_a_replica_writes_the_ticks_it_expects_two_minutes_ahead_and_at_least_two(
    clock: FakeClock, state: MemoryState
) -> None:
    scheduler = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="r1")
    scheduler.add_job(every(seconds=10), noop, name="often")
    scheduler.add_job(cron("0 3 * * *"), noop, name="nightly")
    scheduler.add_job(every(seconds=0.5), noop, name="fast")
    scheduler.start()
    try:
        expected = written(state, "r1")
        assert expected["often"] == tuple(START + timedelta(seconds=10 * n) for n in range(1, 13))
        assert expected["nightly"] == (z(2026, 1, 1, 3), z(2026, 1, 2, 3))
        assert len(expected["fast"]) == 100  # at most: a reader extrapolates past them
        assert expected["fast"][-1] - expected["fast"][-2] == timedelta(seconds=0.5)
    finally:
        scheduler.shutdown()


def test_a_stopping_replica_leaves_its_latest_expectations_and_drops_removed_jobs(
    clock: FakeClock, state: MemoryState
) -> None:
    scheduler = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="r1")
    scheduler.add_job(every(minutes=1), noop, name="kept")
    scheduler.add_job(every(minutes=1), noop, name="dropped")
    scheduler.start()
    assert clock.wait_for_sleepers(1)
    clock.set(START + timedelta(minutes=5))
    scheduler.wait_idle()
    scheduler.remove_job("dropped")
    scheduler.shutdown()
    expected = written(state, "r1")
    assert list(expected) == ["kept"]
    assert expected["kept"][0] == START + timedelta(minutes=6)
    status = asyncio.run(MemoryBackend(state).cluster_status())
    assert [r.alive for r in status.replicas] == []  # it closed: no longer a replica


def test_a_process_under_a_known_replica_id_drops_the_rows_it_does_not_schedule(
    clock: FakeClock, state: MemoryState
) -> None:
    """A restarted container keeps its hostname and pid, so its replica id: the jobs a new
    version dropped must not stay registered under that id."""
    before = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="web-1")
    before.add_job(every(minutes=1), noop, name="kept")
    before.add_job(every(minutes=1), noop, name="dropped")
    before.start()
    before.shutdown()
    after = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="web-1")
    after.add_job(every(minutes=1), noop, name="kept")
    after.start()
    try:
        assert list(written(state, "web-1")) == ["kept"]
    finally:
        after.shutdown()


class EveryHour:
    """A trigger of one's own, without a ``__repr__``."""

    def next_after(self, instant: datetime, /) -> datetime | None:
        return instant.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def test_a_trigger_without_a_repr_is_one_definition_on_every_replica(
    clock: FakeClock, state: MemoryState
) -> None:
    replicas = [
        Scheduler(clock=clock, backend=MemoryBackend(state), replica_id=name)
        for name in ("r1", "r2")
    ]
    for scheduler in replicas:
        scheduler.add_job(EveryHour(), noop, name="hourly")
        scheduler.start()
    try:
        view = replicas[1].cluster_status().job("hourly")
        assert view is not None
        assert view.drift == ()
        assert view.trigger is not None
        assert view.trigger.endswith("EveryHour object>")
    finally:
        for scheduler in replicas:
            scheduler.shutdown()


def test_a_limited_job_expects_no_more_ticks_than_it_has_runs_left(
    clock: FakeClock, state: MemoryState
) -> None:
    scheduler = Scheduler(clock=clock, backend=MemoryBackend(state), replica_id="r1")
    scheduler.add_job(every(seconds=1), noop, name="three", max_runs=3)
    scheduler.start()
    assert written(state, "r1")["three"] == tuple(START + timedelta(seconds=n) for n in (1, 2, 3))
    for second in range(1, 4):
        assert clock.wait_for_sleepers(1)
        clock.set(START + timedelta(seconds=second))
        scheduler.wait_idle()
    scheduler.shutdown()
    assert written(state, "r1")["three"] == ()  # its runs are over: nothing is expected


@pytest.mark.parametrize(
    ("age", "problem"), [(timedelta(hours=2), True), (timedelta(days=2), False)]
)
def test_a_failure_of_a_job_nobody_registers_is_history_after_a_day(
    age: timedelta, problem: bool
) -> None:
    failed = replace(ledger("dropped", NOW - age, "failed"), last_finished_at=NOW - age)
    status = build_status("", NOW, [failed], [], [], [replica("r1", NOW, True)])
    assert [line.startswith("dropped: last run failed") for line in status.problems()] == (
        [True] if problem else []
    )


def test_each_problem_is_a_typed_value_and_problems_are_their_lines() -> None:
    """One decision, read by every surface: the kind and severity for the page's badges and
    colours, the text for the lines of ``--check`` and the table's notes."""
    failed = JobStatus(
        "f", "r1", NOW, NOW, NOW, "timed_out", None, None, (), 0, (("r2", 7), ("r3", 9)), NOW
    )
    status = build_status(
        "",
        NOW,
        [failed, ledger("late", NOW - timedelta(minutes=10))],
        [
            registration("f", "r1", None),
            registration("f", "r2", None, fp="b"),
            registration("late", "r9", NOW - timedelta(minutes=5), alive=False),
        ],
        [],
        [replica("r1", NOW, True), replica("r2", NOW, True)],
    )
    f, late = status.jobs
    found = status.job_problems(f)
    assert [(p.job, p.kind, p.severity) for p in found] == [
        ("f", ProblemKind.DRIFT, Severity.WARNING),
        ("f", ProblemKind.LAST_RUN_FAILED, Severity.ERROR),
        ("f", ProblemKind.BLOCKED, Severity.ERROR),
        ("f", ProblemKind.BLOCKED, Severity.ERROR),
    ]
    assert found[1].text == "last run timed_out (tick 2026-06-01T12:00:00+00:00)"
    assert found[2].line == (
        "f: run 7 of replica r2 stopped heartbeating while its session may hold the job's "
        "lock: the job is blocked"
    )
    [overdue] = status.job_problems(late)
    assert overdue == Problem(
        "late",
        ProblemKind.OVERDUE,
        "overdue: the tick due at 2026-06-01T11:55:00+00:00 has no run 5 min after it (no live "
        "replica schedules it: if it was dropped on purpose, `replicron forget late`)",
    )
    assert status.unscheduled(late)
    assert not status.unscheduled(f)
    assert status.problems() == [p.line for p in (*found, overdue)]
    assert status.to_json()["problems"] == status.problems()


@pytest.mark.parametrize("outcome", list(Outcome))
def test_only_a_run_that_went_wrong_is_a_last_run_problem(outcome: Outcome) -> None:
    status = build_status(
        "",
        NOW,
        [ledger("j", NOW, outcome.value)],
        [registration("j", "r1", None)],
        [],
        [replica("r1", NOW, True)],
    )
    [view] = status.jobs
    assert view.outcome is outcome
    kinds = [p.kind for p in status.job_problems(view)]
    assert kinds == ([ProblemKind.LAST_RUN_FAILED] if outcome.is_failure else [])


def test_an_outcome_this_version_does_not_know_is_no_problem() -> None:
    status = build_status("", NOW, [ledger("j", NOW, "postponed")], [], [], [])
    [view] = status.jobs
    assert view.last_outcome == "postponed"
    assert view.outcome is None
    assert status.problems() == []
