"""The embedded backend beyond the shared contract (tests/contract): its state directory, bad
state, dead and live claimants, close, retention.

Real SQLite files in ``tmp_path`` and real processes; no sleeping: a child process reports
through its stdout, and waiting for it is reading a line or its exit.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock, Timeout

from replicron import ConfigurationError, EmbeddedBackend, StateDirError, job_lock_key
from replicron.backends._ledger import Ledger, migrations, now_us
from replicron.backends._micros import to_micros as to_us
from replicron.backends._processes import process_alive, process_start
from replicron.backends.base import (
    ClaimRequest,
    ClaimStatus,
    Release,
    RunRecord,
    SharedCoordination,
)
from replicron.backends.embedded import LEDGER_NAME
from replicron.events import Outcome
from tests.helpers import z

REPO = Path(__file__).resolve().parents[2]
T0 = z(2024, 1, 1)
CLAIMED, LOCKED = ClaimStatus.CLAIMED, ClaimStatus.LOCKED


def tick(n: int) -> Any:
    return T0 + timedelta(minutes=n)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def opened(state_dir: Path, replica: str = "r0", **options: Any) -> EmbeddedBackend:
    backend = EmbeddedBackend(state_dir, **options)
    await backend.open(replica)
    return backend


async def claim_one(backend: EmbeddedBackend, job: str, n: int, *, lock: bool) -> Any:
    [claimed] = await backend.claim([ClaimRequest(job, tick(n), lock)])
    return claimed


async def skip(backend: EmbeddedBackend, job: str, n: int) -> None:
    record = RunRecord(
        job, tick(n), Outcome.SKIPPED_OVERLAP, backend.replica_id, None, None, None, None
    )
    await backend.release([Release(record, False)])


@contextmanager
def ledger(state_dir: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(state_dir / LEDGER_NAME, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def row(state_dir: Path, job: str, n: int) -> tuple[Any, ...]:
    with ledger(state_dir) as conn:
        found = conn.execute(
            "SELECT outcome, error, started_at IS NOT NULL FROM replicron_runs"
            " WHERE job = ? AND scheduled_at = ?",
            (job, to_us(tick(n))),
        ).fetchone()
    assert found is not None
    return tuple(found)


def insert_open(state_dir: Path, job: str, n: int, pid: int, start: int | None) -> None:
    """An open, started row of ``job`` claimed by process ``pid`` (as a run in progress)."""
    with ledger(state_dir) as conn:
        conn.execute(
            "INSERT INTO replicron_runs (job, scheduled_at, replica_id, pid, pid_start,"
            " claimed_at, started_at) VALUES (?, ?, 'other', ?, ?, ?, ?)",
            (job, to_us(tick(n)), pid, start, now_us(), now_us()),
        )


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def state_error(state_dir: Path) -> StateDirError:
    with pytest.raises(StateDirError) as caught:
        run(opened(state_dir))
    assert "\n" not in str(caught.value)
    return caught.value


# ---- the state directory ----------------------------------------------------------------


def test_a_new_state_dir_gets_a_wal_ledger_with_its_migrations(tmp_path: Path) -> None:
    state_dir = tmp_path / "deep" / "state"

    async def main() -> None:
        for _ in range(2):  # opening again applies nothing again
            backend = await opened(state_dir)
            await backend.close()
            await backend.close()  # idempotent

    run(main())
    assert sorted(p.name for p in (state_dir / "locks").iterdir()) == [".probe"]
    with ledger(state_dir) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        versions = conn.execute("SELECT version, name FROM replicron_migrations").fetchall()
    assert versions == [
        (1, "initial"),
        (2, "manual_runs"),
        (3, "job_registry_and_pauses"),
        (4, "leader_lease"),
        (5, "run_requests"),
        (6, "missed_ranges"),
    ]


def test_a_garbage_ledger_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    garbage = bytes(range(256)) * 16
    (tmp_path / LEDGER_NAME).write_bytes(garbage)
    error = state_error(tmp_path)
    assert error.path == str(tmp_path / LEDGER_NAME)
    assert str(error) == (
        f"replicron state {tmp_path / LEDGER_NAME}: is not a usable SQLite database:"
        " file is not a database"
    )
    assert isinstance(error, ConfigurationError)
    assert (tmp_path / LEDGER_NAME).read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER_NAME]


def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    assert str(state_error(tmp_path / "state")) == (
        f"replicron state {tmp_path / 'state'}: exists and is not a directory"
    )


@pytest.mark.parametrize("where", ["/dev/null/state", "file/state"])
def test_a_state_dir_that_cannot_be_created_is_refused(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("a regular file")
    path = tmp_path / where
    assert str(state_error(path)) == f"replicron state {path}: cannot be created: Not a directory"


def test_a_ledger_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / LEDGER_NAME).mkdir()
    assert str(state_error(tmp_path)) == (
        f"replicron state {tmp_path / LEDGER_NAME}: is not a regular file"
    )


def test_a_ledger_written_by_a_newer_replicron_is_refused(tmp_path: Path) -> None:
    run(run_and_close(tmp_path))
    with ledger(tmp_path) as conn:
        conn.execute("INSERT INTO replicron_migrations VALUES (99, 'future', 0)")
    error = state_error(tmp_path)
    assert error.problem == (
        "schema version 99 was written by a newer replicron (this one knows up to 6)"
    )


def test_a_ledger_of_an_earlier_version_is_upgraded_keeping_its_rows(tmp_path: Path) -> None:
    [(version, name, statements)] = [m for m in migrations() if m[0] == 1]
    with ledger(tmp_path) as conn:
        conn.execute(
            "CREATE TABLE replicron_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at INTEGER NOT NULL)"
        )
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO replicron_migrations VALUES (?, ?, 0)", (version, name))
        conn.execute(
            "INSERT INTO replicron_runs (job, scheduled_at, replica_id, claimed_at, outcome)"
            " VALUES ('report', ?, 'old', 0, 'succeeded')",
            (to_us(tick(3)),),
        )

    async def main() -> None:
        backend = await opened(tmp_path)
        try:
            assert await backend.last_ticks(["report"]) == {"report": tick(3)}
            [again] = await backend.claim([ClaimRequest("report", tick(3), False)])
            assert again.status is ClaimStatus.TAKEN
        finally:
            await backend.close()

    run(main())
    with ledger(tmp_path) as conn:
        assert conn.execute("SELECT job, manual FROM replicron_runs").fetchall() == [("report", 0)]
        versions = [v for (v,) in conn.execute("SELECT version FROM replicron_migrations")]
        assert versions == [m[0] for m in migrations()]


async def run_and_close(state_dir: Path) -> None:
    backend = await opened(state_dir)
    await backend.close()


_OPEN_IN_CHILD = """
import asyncio, sys
from replicron import EmbeddedBackend, StateDirError
try:
    asyncio.run(EmbeddedBackend(sys.argv[1]).open("child"))
except StateDirError as exc:
    print(exc)
    sys.exit(3)
print("opened")
"""


def open_without_privileges(state_dir: Path) -> subprocess.CompletedProcess[str]:
    """Open a backend in a child that is subject to file permissions (root without its
    capabilities, when the tests run as root)."""
    command = [sys.executable, "-c", _OPEN_IN_CHILD, str(state_dir)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop the capabilities")
        command = [setpriv, "--inh-caps=-all", "--bounding-set=-all", "--", *command]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("with_ledger", [False, True])
def test_a_read_only_state_dir_is_refused(tmp_path: Path, with_ledger: bool) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    if with_ledger:
        run(run_and_close(state_dir))
    before = sorted(state_dir.rglob("*"))
    state_dir.chmod(0o555)
    try:
        done = open_without_privileges(state_dir)
    finally:
        state_dir.chmod(0o755)
    assert (done.returncode, done.stdout) == (
        3,
        f"replicron state {state_dir}: is not writable by this process\n",
    ), done.stderr
    assert sorted(state_dir.rglob("*")) == before


def test_a_read_only_ledger_is_refused(tmp_path: Path) -> None:
    run(run_and_close(tmp_path))
    (tmp_path / LEDGER_NAME).chmod(0o444)
    before = sorted(tmp_path.rglob("*"))
    done = open_without_privileges(tmp_path)
    assert (done.returncode, done.stdout) == (
        3,
        f"replicron state {tmp_path / LEDGER_NAME}: is not readable and writable by this process\n",
    ), done.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_options_and_use_before_open() -> None:
    for options in ({"busy_timeout": 0}, {"janitor_interval": -1}, {"retention": timedelta()}):
        with pytest.raises(ConfigurationError):
            EmbeddedBackend("/nonexistent", **options)
    backend = EmbeddedBackend("/nonexistent")
    with pytest.raises(ConfigurationError, match="not open"):
        run(backend.claim([ClaimRequest("report", tick(1), False)]))
    run(backend.close())  # closing an unopened backend is fine


def test_what_the_backend_tells_a_scheduler(tmp_path: Path) -> None:
    backend = EmbeddedBackend(tmp_path)
    assert backend.spreads_bursts is True  # other processes claim too
    assert backend.claims_ahead is None  # no clock of its own to claim ahead of
    assert backend.clock_offset() is None
    assert backend.peers is None  # it does not know who else shares the directory
    assert isinstance(backend, SharedCoordination)
    assert not backend.connected

    async def main() -> None:
        await backend.open("r0")
        assert backend.connected
        await backend.close()

    run(main())
    assert not backend.connected


def test_open_twice_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await opened(tmp_path)
        with pytest.raises(ConfigurationError, match="open already"):
            await backend.open("again")
        await backend.close()

    run(main())


# ---- locks and claimants ----------------------------------------------------------------


def test_the_run_lock_is_a_file_lock_named_by_the_lock_key(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await opened(tmp_path)
        path = backend.lock_path("cleanup")
        assert path == tmp_path / "locks" / f"{job_lock_key('cleanup') % 2**64:016x}.lock"
        held = await claim_one(backend, "cleanup", 1, lock=True)
        assert held.locked
        with pytest.raises(Timeout):  # another open file description cannot take it
            FileLock(str(path), timeout=0).acquire(timeout=0)
        await backend.close()
        other = FileLock(str(path), timeout=0)
        other.acquire(timeout=0)  # close() released it
        other.release()

    run(main())


_CLAIM_IN_CHILD = """
import asyncio, sys
from datetime import datetime, UTC
from replicron.backends.base import ClaimRequest
from replicron.backends.embedded import EmbeddedBackend

async def main():
    backend = EmbeddedBackend(sys.argv[1])
    await backend.open("child")
    first = datetime(2024, 1, 1, 0, 1, tzinfo=UTC)
    [claimed] = await backend.claim([ClaimRequest("cleanup", first, True)])
    print(claimed.status.value, claimed.run_id, flush=True)
    sys.stdin.read()  # hold the run until killed

asyncio.run(main())
"""


def test_a_killed_claimant_frees_its_job_and_its_run_ends_abandoned(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await opened(tmp_path, janitor_interval=3600)
        with subprocess.Popen(
            [sys.executable, "-c", _CLAIM_IN_CHILD, str(tmp_path)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            try:
                assert child.stdout is not None
                assert child.stdout.readline().split()[0] == "claimed"
                # The child's run holds the job ...
                assert (await claim_one(backend, "cleanup", 2, lock=True)).status is LOCKED
                await skip(backend, "cleanup", 2)
            finally:
                child.kill()
                child.wait(30)
        # ... until it is killed: the kernel dropped its lock, its open row is abandoned.
        resumed = await claim_one(backend, "cleanup", 3, lock=True)
        assert (resumed.status, resumed.locked) == (CLAIMED, True)
        outcome, error, _ = row(tmp_path, "cleanup", 1)
        assert outcome == "abandoned"
        assert error == f"process {child.pid} of replica child died with the tick open"
        await backend.close()

    run(main())


def test_a_live_process_with_a_started_run_keeps_the_job_even_without_the_lock(
    tmp_path: Path,
) -> None:
    me, started = os.getpid(), process_start(os.getpid())

    async def main() -> None:
        backend = await opened(tmp_path, janitor_interval=3600)
        insert_open(tmp_path, "cleanup", 1, me, started)
        assert (await claim_one(backend, "cleanup", 2, lock=True)).status is LOCKED
        await skip(backend, "cleanup", 2)
        assert row(tmp_path, "cleanup", 1) == (None, None, 1)
        # A dead pid's run is over.
        insert_open(tmp_path, "cleanup", 3, dead_pid(), None)
        with ledger(tmp_path) as conn:
            conn.execute("UPDATE replicron_runs SET outcome = 'succeeded' WHERE pid = ?", [me])
        assert (await claim_one(backend, "cleanup", 4, lock=True)).locked
        assert row(tmp_path, "cleanup", 3)[0] == "abandoned"
        await backend.close()

    run(main())


@pytest.mark.skipif(process_start(os.getpid()) is None, reason="no /proc start times here")
def test_a_reused_pid_is_not_taken_for_the_claimant() -> None:
    me, started = os.getpid(), process_start(os.getpid())
    assert started is not None
    assert process_alive(me, started)
    assert process_alive(me, None)
    assert not process_alive(me, started + 1)  # same pid, another process
    assert not process_alive(dead_pid(), None)


def test_open_records_the_open_ticks_of_dead_processes_abandoned(tmp_path: Path) -> None:
    run(run_and_close(tmp_path))
    gone = dead_pid()
    insert_open(tmp_path, "report", 1, gone, None)
    insert_open(tmp_path, "report", 2, os.getpid(), process_start(os.getpid()))
    run(run_and_close(tmp_path))
    assert row(tmp_path, "report", 1)[:2] == (
        "abandoned",
        f"process {gone} of replica other died with the tick open",
    )
    assert row(tmp_path, "report", 2)[0] is None  # alive: still running


def test_close_records_the_ticks_it_never_recorded_and_frees_their_locks(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        a, b = await opened(tmp_path, "a"), await opened(tmp_path, "b")
        assert (await claim_one(a, "cleanup", 1, lock=True)).locked
        assert (await claim_one(a, "report", 1, lock=False)).status is CLAIMED
        await a.close()
        for job in ("cleanup", "report"):
            assert row(tmp_path, job, 1)[:2] == ("abandoned", "replica a closed its backend first")
        assert (await claim_one(b, "cleanup", 2, lock=True)).locked
        await b.close()

    run(main())


@contextmanager
def writes_refused(state_dir: Path) -> Iterator[None]:
    """The ledger refuses every write meanwhile: another connection holds its write lock
    longer than the backend's busy timeout."""
    with ledger(state_dir) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            other.rollback()


def succeeded(claim: Any) -> Release:
    """The release of a claimed run that succeeded, unlocking it."""
    tick, finished = claim.scheduled_at, claim.scheduled_at + timedelta(seconds=1)
    record = RunRecord(claim.job, tick, Outcome.SUCCEEDED, "r0", claim.run_id, tick, finished, None)
    return Release(record, True)


def assert_lock_free(path: Path) -> None:
    other = FileLock(str(path), timeout=0)
    other.acquire(timeout=0)  # another open file description takes it at once
    other.release()


async def ended_while_refused(state_dir: Path) -> EmbeddedBackend:
    """A backend whose run of "cleanup" at tick 1 succeeded while the ledger refused writes."""
    backend = await opened(state_dir, busy_timeout=0.05)
    first = await claim_one(backend, "cleanup", 1, lock=True)
    with writes_refused(state_dir):
        await backend.release([succeeded(first)])
    return backend


def test_an_outcome_the_ledger_refuses_is_kept_and_written_with_the_next_claim(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        backend = await ended_while_refused(tmp_path)
        assert_lock_free(backend.lock_path("cleanup"))  # the run ended: so did its lock
        assert row(tmp_path, "cleanup", 1) == (None, None, 1)  # its outcome waits
        # Another replica finds the run going as long as its outcome waits.
        other = await opened(tmp_path, "other")
        assert (await claim_one(other, "cleanup", 2, lock=True)).status is LOCKED
        await skip(other, "cleanup", 2)
        # The next claim of the run's own replica writes the outcome, and runs the job.
        third = await claim_one(backend, "cleanup", 3, lock=True)
        assert (third.status, third.locked) == (CLAIMED, True)
        assert row(tmp_path, "cleanup", 1) == ("succeeded", None, 1)
        await backend.close()
        await other.close()

    run(main())


def test_an_outcome_still_refused_at_the_next_claim_keeps_waiting(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await ended_while_refused(tmp_path)
        with writes_refused(tmp_path), pytest.raises(sqlite3.OperationalError):
            await claim_one(backend, "cleanup", 2, lock=True)
        # Its own ended run keeps the job from this process no more than its lock does.
        third = await claim_one(backend, "cleanup", 3, lock=True)
        assert (third.status, third.locked) == (CLAIMED, True)
        assert row(tmp_path, "cleanup", 1) == ("succeeded", None, 1)
        await backend.close()

    run(main())


def test_a_run_known_to_have_ended_does_not_keep_its_job_while_its_row_is_open(
    tmp_path: Path,
) -> None:
    run(run_and_close(tmp_path))
    me, started = os.getpid(), process_start(os.getpid())
    for n in (1, 2):
        insert_open(tmp_path, "cleanup", n, me, started)
    with ledger(tmp_path) as conn:
        [(ended,), (claimed,)] = conn.execute(
            "SELECT run_id FROM replicron_runs ORDER BY run_id"
        ).fetchall()
        assert not Ledger.start_alone(conn, "cleanup", claimed)  # a live process's run
        assert Ledger.start_alone(conn, "cleanup", claimed, {ended})


def test_an_outcome_that_waited_replaces_an_abandoned_written_meanwhile(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await ended_while_refused(tmp_path)
        with ledger(tmp_path) as janitor:  # as a janitor that took the run's process for dead
            janitor.execute("UPDATE replicron_runs SET outcome = 'abandoned', finished_at = 1")
        await claim_one(backend, "cleanup", 2, lock=True)
        assert row(tmp_path, "cleanup", 1) == ("succeeded", None, 1)
        await backend.close()

    run(main())


def test_an_outcome_that_waits_at_close_is_written_then_not_abandoned(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await ended_while_refused(tmp_path)
        await backend.close()
        assert row(tmp_path, "cleanup", 1) == ("succeeded", None, 1)

    run(main())


def test_the_wal_stays_within_a_mebibyte(tmp_path: Path) -> None:
    async def main() -> None:
        backend = await opened(tmp_path)
        wal = tmp_path / f"{LEDGER_NAME}-wal"
        largest = 0
        for n in range(200):  # enough writes to grow SQLite's default WAL past 1 MiB
            claimed = await claim_one(backend, "cleanup", n, lock=False)
            await backend.release([succeeded(claimed)._replace(unlock=False)])
            largest = max(largest, wal.stat().st_size)
        await backend.close()
        assert 0 < largest <= 1024 * 1024

    run(main())


def test_retention_prunes_old_finished_rows_but_each_jobs_latest(tmp_path: Path) -> None:
    run(run_and_close(tmp_path))
    old = now_us() - 30 * 86_400_000_000
    with ledger(tmp_path) as conn:
        for job, n, claimed_at, outcome in [
            ("report", 1, old, "succeeded"),
            ("report", 2, old, "failed"),
            ("report", 3, now_us(), "succeeded"),  # recent
            ("sync", 1, old, "succeeded"),  # old, but sync's latest
        ]:
            conn.execute(
                "INSERT INTO replicron_runs (job, scheduled_at, replica_id, claimed_at, outcome)"
                " VALUES (?, ?, 'r', ?, ?)",
                (job, to_us(tick(n)), claimed_at, outcome),
            )
        for replica, seen in (("gone", old), ("recent", now_us())):  # registrations too
            conn.execute(
                "INSERT INTO replicron_jobs (job, replica_id, trigger, fingerprint, grace,"
                " expected, last_seen) VALUES ('report', ?, 'every(...)', 'f', 0, '', ?)",
                (replica, seen),
            )
    run(run_and_close(tmp_path))  # the janitor runs at open
    with ledger(tmp_path) as conn:
        left = conn.execute("SELECT job, scheduled_at FROM replicron_runs ORDER BY 1, 2").fetchall()
        registered = conn.execute("SELECT replica_id FROM replicron_jobs").fetchall()
    assert left == [("report", to_us(tick(3))), ("sync", to_us(tick(1)))]
    assert registered == [("recent",)]


def test_runs_pruned_by_retention_still_count_against_max_runs(tmp_path: Path) -> None:
    run(run_and_close(tmp_path))
    old = now_us() - 30 * 86_400_000_000
    with ledger(tmp_path) as conn:
        for n, outcome in [(1, "succeeded"), (2, "missed"), (3, "failed"), (4, "succeeded")]:
            conn.execute(
                "INSERT INTO replicron_runs (job, scheduled_at, replica_id, claimed_at, outcome)"
                " VALUES ('report', ?, 'r', ?, ?)",
                (to_us(tick(n)), old, outcome),
            )
    run(run_and_close(tmp_path))  # the janitor prunes ticks 1 to 3 at open

    async def main() -> list[ClaimStatus]:
        backend = await opened(tmp_path)
        claims = await backend.claim(
            [
                ClaimRequest("report", tick(5), False, max_runs=3),  # 2 pruned runs + tick 4
                ClaimRequest("sync", tick(5), False, max_runs=3),
            ]
        )
        await backend.close()
        return [c.status for c in claims]

    assert run(main()) == [ClaimStatus.EXHAUSTED, CLAIMED]
    with ledger(tmp_path) as conn:
        left = conn.execute("SELECT job, scheduled_at FROM replicron_runs ORDER BY 1, 2").fetchall()
        tally = conn.execute("SELECT job, runs FROM replicron_pruned_runs").fetchall()
    assert left == [("report", to_us(tick(4))), ("sync", to_us(tick(5)))]
    assert tally == [("report", 2)]


def test_last_ticks_of_many_jobs(tmp_path: Path) -> None:
    jobs = [f"job-{n}" for n in range(1200)]  # more than one statement's parameters

    async def main() -> None:
        backend = await opened(tmp_path)
        claims = await backend.claim([ClaimRequest(job, tick(1), False) for job in jobs])
        assert {c.status for c in claims} == {CLAIMED}
        assert await backend.last_ticks(jobs) == dict.fromkeys(jobs, tick(1))
        await backend.close()

    run(main())


class _OneKeyBackend(EmbeddedBackend):
    """Every job on one lock key: the collision check driven through the method it uses."""

    def lock_key(self, job: str) -> int:
        return 42


def test_a_lock_key_collision_is_the_same_error_as_with_postgres(tmp_path: Path) -> None:
    from replicron import LockKeyCollisionError

    backend = _OneKeyBackend(tmp_path)
    backend.register_job("cleanup")
    with pytest.raises(LockKeyCollisionError, match="same lock key \\(42\\) as job 'cleanup'"):
        backend.register_job("job-42")


def test_the_ledger_accepts_every_outcome_and_nothing_else(tmp_path: Path) -> None:
    import re

    from replicron import Outcome

    backend = asyncio.run(opened(tmp_path))
    asyncio.run(backend.close())
    with closing(sqlite3.connect(backend.ledger_path)) as conn:
        [(table,)] = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'replicron_runs'")
        listed = re.search(r"outcome\s+TEXT CHECK \(outcome IN \(([^)]*)\)\)", table)
        assert listed is not None
        assert set(re.findall(r"'(\w+)'", listed[1])) == {outcome.value for outcome in Outcome}
        insert = (
            "INSERT INTO replicron_runs (job, scheduled_at, replica_id, claimed_at, outcome)"
            " VALUES ('job', ?, 'r', 0, ?)"
        )
        for n, outcome in enumerate(Outcome):
            conn.execute(insert, (n, outcome.value))
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(insert, (99, "exploded"))


def test_every_named_query_is_used_and_every_one_used_is_named() -> None:
    import re

    from replicron.backends import _sql
    from replicron.backends.sqlfiles import SqlFiles

    source = "".join(p.read_text() for p in Path(_sql.__file__).parent.glob("*.py"))
    used = set(re.findall(r"\bsql\(\"(\w+)\"\)", source))
    assert used == set(SqlFiles("replicron.backends").queries())
