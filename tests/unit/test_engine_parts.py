"""The engine's parts, each on its own: no scheduler, no loop thread, no worker threads where
the part does not need them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import pytest

from replicron import (
    DuplicateJobError,
    InvalidJobOptionError,
    JobNotFoundError,
    MemoryBackend,
    Outcome,
    Scheduler,
    every,
)
from replicron._engine.background import Background
from replicron._engine.health import BackendHealth
from replicron._engine.lifecycle import Lifecycle
from replicron._engine.observe import Observer
from replicron._engine.planner import Tick
from replicron._engine.recorder import Recorder
from replicron._engine.recovery import Recovery
from replicron._engine.registry import JobRegistry, JobState
from replicron._engine.retries import Retries
from replicron._engine.spec import JobSpec, build_job_spec
from replicron._schedule.tz import MICROSECOND
from replicron.backends.base import Claim, ClaimStatus, Release, RunRecord
from replicron.errors import SchedulerClosedError
from replicron.testing import FakeClock
from tests.helpers import START, noop


def spec(name: str, **options: object) -> JobSpec:
    fields: dict[str, object] = {
        "tags": (),
        "overlap": "skip",
        "timeout": None,
        "start_at": None,
        "stop_at": None,
        "max_runs": None,
        "catch_up": "latest",
        "misfire_grace": None,
    }
    fields.update(options)
    trigger = fields.pop("trigger", every(seconds=10))
    return build_job_spec(trigger, noop, (), {}, name=name, default_tz=START.tzinfo, **fields)  # type: ignore[arg-type]


class Parts:
    """A registry on a fake clock and the in-memory backend, and what records outcomes."""

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        self.clock = FakeClock(START)
        self.backend = MemoryBackend() if backend is None else backend
        self.life = Lifecycle()
        self.wakes = 0
        self.registry = JobRegistry(
            clock=self.clock,
            timezone=START.tzinfo,  # type: ignore[arg-type]
            backend=self.backend,
            life=self.life,
            wake=self._woken,
        )
        self.background = Background(lambda: None)
        self.observer = Observer(logging.getLogger("tests.parts"), "r1", (), self.background.spawn)
        self.recorder = Recorder(
            backend=self.backend,
            registry=self.registry,
            observer=self.observer,
            background=self.background,
            life=self.life,
            replica_id="r1",
            health=BackendHealth(self.observer, self.clock.now),
        )

    def _woken(self) -> None:
        self.wakes += 1


# ---- the registry: jobs and their plan, no loop --------------------------------------


def test_the_registry_plans_jobs_and_hands_out_what_is_due() -> None:
    parts = Parts()
    registry = parts.registry
    registry.add_job(spec("a"))
    registry.add_job(spec("b", trigger=every(seconds=30)))
    assert parts.wakes == 2
    assert registry.next_runs("a", 2) == [
        START + timedelta(seconds=10),
        START + timedelta(seconds=20),
    ]
    parts.clock.advance(timedelta(seconds=30))
    decision, catch_up, manual = registry.take_due(parts.clock.now())
    assert decision.due == [
        Tick("a", START + timedelta(seconds=30)),
        Tick("b", START + timedelta(seconds=30)),
    ]
    assert [t.scheduled_at for t in decision.missed] == [
        START + timedelta(seconds=s) for s in (10, 20)
    ]
    assert catch_up == []
    assert manual == []


def test_the_registry_refuses_duplicates_unknown_names_and_jobs_that_never_run() -> None:
    parts = Parts()
    parts.registry.add_job(spec("a"))
    with pytest.raises(DuplicateJobError):
        parts.registry.add_job(spec("a"))
    with pytest.raises(JobNotFoundError):
        parts.registry.remove_job("nope")
    with pytest.raises(InvalidJobOptionError, match="would never run"):
        parts.registry.add_job(spec("never", stop_at=START + timedelta(seconds=5)))
    assert parts.registry.names() == ["a"]


def test_run_now_and_catch_up_requests_go_to_the_next_step() -> None:
    parts = Parts()
    registry = parts.registry
    registry.add_job(spec("a"))
    parts.life.phase = "running"
    registry.add_job(spec("b"))  # added while running: its missed ticks are looked up
    registry.run_now("a")
    registry.run_now("a")
    _, catch_up, manual = registry.take_due(parts.clock.now())
    assert catch_up == ["b"]
    # START is a tick of "a" (every 10 s): its manual runs are recorded just off it, each at
    # an instant of its own.
    assert manual == [Tick("a", START + MICROSECOND), Tick("a", START + 2 * MICROSECOND)]
    assert registry.take_due(parts.clock.now())[1:] == ([], [])


def test_a_closed_registry_refuses_changes() -> None:
    parts = Parts()
    parts.life.phase = "stopped"
    with pytest.raises(SchedulerClosedError):
        parts.registry.add_job(spec("a"))


# ---- the recorder: outcomes logged, kept and written in batches -------------------------


class _Releases(MemoryBackend):
    """The in-memory backend, keeping the batches it was asked to write."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.batches: list[list[Release]] = []
        self.fail = fail

    async def release(self, releases: Sequence[Release]) -> None:
        self.batches.append(list(releases))
        if self.fail:
            raise ConnectionError("gone")
        await super().release(releases)


def test_outcomes_are_written_in_one_batch_and_kept_as_the_latest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _Releases()
    parts = Parts(backend)
    parts.registry.add_job(spec("a"))
    state = parts.registry.get("a")
    assert state is not None
    released: list[Sequence[JobState | None]] = []

    async def after_release(states: Sequence[JobState | None]) -> None:
        released.append(states)

    parts.recorder.after_release = after_release
    parts.life.phase = "running"
    claim = Claim("a", START, ClaimStatus.CLAIMED, 7, True)

    async def record_two() -> None:
        parts.background.open(asyncio.get_running_loop())
        parts.recorder.record(state, claim, Outcome.SKIPPED_OVERLAP, "busy", unlock=True)
        parts.recorder.record(state, claim._replace(run_id=8), Outcome.MISSED, "late")
        assert parts.recorder  # queued, not yet written
        await parts.background.wait(5)

    caplog.set_level(logging.INFO, logger="tests.parts")
    asyncio.run(record_two())
    assert [[(r.record.outcome, r.unlock) for r in batch] for batch in backend.batches] == [
        [(Outcome.SKIPPED_OVERLAP, True), (Outcome.MISSED, False)]
    ]
    assert released == [[None, None]]
    last = parts.registry.last_run("a")
    assert last is not None
    assert (last.outcome, last.detail) == (Outcome.MISSED, "late")
    assert [r.event for r in caplog.records] == ["skipped_overlap", "missed"]  # type: ignore[attr-defined]


def test_a_failed_write_is_logged_and_what_waited_still_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _Releases(fail=True)
    parts = Parts(backend)
    started: list[int] = []

    async def after_release(states: Sequence[JobState | None]) -> None:
        started.append(len(states))

    parts.recorder.after_release = after_release
    parts.life.phase = "running"
    record = RunRecord("a", START, Outcome.SUCCEEDED, "r1", 1, START, START, None)

    async def write() -> None:
        parts.background.open(asyncio.get_running_loop())
        parts.recorder.release(record, True, None)
        await parts.background.wait(5)

    asyncio.run(write())
    assert started == [1]
    assert any("could not record" in r.getMessage() for r in caplog.records)


# ---- recovery: ticks missed while down -------------------------------------------------


async def no_backlog(backlogs: Mapping[str, list[datetime]]) -> None:
    raise AssertionError(f'catch_up="latest" has no backlog: {backlogs}')


def test_catch_up_runs_the_latest_missed_tick_and_records_the_rest() -> None:
    backend = MemoryBackend()
    parts = Parts(backend)
    parts.registry.add_job(spec("a"))
    parts.life.phase = "running"
    # The job last ran a minute ago: five ticks fell due since, while nobody ran it.
    last = RunRecord("a", START, Outcome.SUCCEEDED, "old", 1, START, START, None)
    recovery = Recovery(
        backend=backend,
        registry=parts.registry,
        recorder=parts.recorder,
        retries=Retries(),
        observer=parts.observer,
        queue_backlogs=no_backlog,
    )
    parts.clock.advance(timedelta(seconds=55))

    async def catch_up() -> list[Tick]:
        parts.background.open(asyncio.get_running_loop())
        await backend.open("r1")
        assert await backend.record_unclaimed([last]) == [True]
        runs = await recovery.catch_up(["a"], parts.clock.now())
        await parts.background.wait(5)
        return runs

    assert asyncio.run(catch_up()) == [Tick("a", START + timedelta(seconds=50))]
    missed = [r.scheduled_at for r in backend.state.history("a") if r.outcome is Outcome.MISSED]
    assert missed == [START + timedelta(seconds=s) for s in (10, 20, 30, 40)]


# ---- what is made ahead for the next instant ------------------------------------------


def _prepare_now(scheduler: Scheduler) -> None:
    """Run the engine's preparation of the next instant on its loop, as it does when idle
    (in real time, which a fake clock does not drive), and wait for it."""
    engine, loop = scheduler._engine, scheduler._loop
    assert loop is not None

    async def prepare() -> None:
        engine._prepare_now()

    asyncio.run_coroutine_threadsafe(prepare(), loop).result(5)


def test_the_run_made_ahead_is_the_one_the_task_sees_and_changes_since_are_honoured() -> None:
    from replicron import RunContext, current_run
    from replicron._engine.runs import Run

    clock = FakeClock(START)
    backend = MemoryBackend()
    seen: list[tuple[str, RunContext, bool]] = []

    def task(name: str) -> None:
        seen.append((name, current_run(), name in backend.state.locks_held()))

    scheduler = Scheduler(clock=clock, backend=backend)
    scheduler.add_job(every(seconds=10), task, "kept", name="kept")
    scheduler.add_job(every(seconds=10), task, "changed", name="changed")
    scheduler.start()
    try:
        _prepare_now(scheduler)
        made = dict(scheduler._engine._runs._prepared)
        assert sorted(made) == ["changed", "kept"]
        assert all(run.scheduled_at == START + timedelta(seconds=10) for run in made.values())
        # Changed after its run was made: its lock is no longer wanted.
        scheduler.get_job("changed").update(overlap="allow")
        clock.advance(timedelta(seconds=10))
        scheduler.wait_idle()
    finally:
        scheduler.shutdown()
    runs = {name: (ctx, locked) for name, ctx, locked in seen}
    assert runs["kept"][0] is made["kept"]  # the object made ahead, filled in at the instant
    assert runs["kept"][1] is True  # and holding its lock while it ran
    assert isinstance(runs["changed"][0], Run)
    assert runs["changed"][1] is False  # overlap="allow": no lock, whatever was made ahead
    assert {ctx.run_id for ctx, _ in runs.values()} == {1}
