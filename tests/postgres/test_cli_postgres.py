"""`replicron migrate` and `replicron status` against a real database, as real processes."""

from __future__ import annotations

import asyncio
import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

from replicron import Scheduler, every, job_lock_key
from replicron.postgres import PostgresBackend
from replicron.postgres._sql import migrations
from replicron.testing import FakeClock
from tests.helpers import run_cli, z


def with_password(dsn: str, password: str) -> str:
    params = conninfo_to_dict(dsn)
    host, port, dbname = params.get("host"), params.get("port", 5432), params.get("dbname")
    user = params.get("user", "postgres")
    # trust auth: the password is ignored by the server, but must never be printed.
    return f"postgresql://{user}:{password}@{host}:{port}/{dbname}"


def test_migrate_applies_once_and_masks_the_password(dsn: str) -> None:
    url = with_password(dsn, "hunter2")
    first = run_cli("migrate", "--database-url", url)
    assert first.returncode == 0, first.stderr
    masked = url.replace("hunter2", "***")
    names = [f"{m.version:04d}_{m.name}" for m in migrations()]
    assert first.stdout.splitlines() == [f"applied {name} to {masked}" for name in names]
    again = run_cli("migrate", "--database-url", url)
    assert again.returncode == 0
    assert again.stdout.strip().endswith("is up to date")
    assert "hunter2" not in first.stdout + again.stdout + first.stderr + again.stderr
    with psycopg.connect(dsn) as conn:
        recorded = conn.execute("SELECT version, name FROM replicron_migrations ORDER BY 1")
        assert recorded.fetchall() == [(m.version, m.name) for m in migrations()]


def test_status_lists_jobs(dsn: str) -> None:
    clock = FakeClock(z(2026, 1, 1))
    with Scheduler(clock=clock, backend=PostgresBackend(dsn), replica_id="node-1") as s:
        s.add_job(every(seconds=10), lambda: None, name="ok")

        def broken() -> None:
            raise RuntimeError("disk full")

        s.add_job(every(seconds=10), broken, name="broken")
        clock.set(z(2026, 1, 1, 0, 0, 10))
        s.wait_idle()
    result = run_cli("status", "--database-url", dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "JOB",
        "LAST",
        "TICK",
        "OUTCOME",
        "REPLICA",
        "TOOK",
        "LAST",
        "SUCCESS",
        "RUNNING",
        "NEXT",
        "DUE",
        "STATE",
        "MISSED",
        "24H",
    ]
    broken_row = lines[1].split()
    assert broken_row[:4] == ["broken", "2026-01-01T00:00:10+00:00", "failed", "node-1"]
    # took (fake clock: 0 ms), no success, nothing running, next due, state, missed: the fake
    # clock stopped in January, and by the database's clock that tick is long overdue.
    assert broken_row[4:] == [
        "0",
        "ms",
        "-",
        "-",
        "2026-01-01T00:00:20+00:00",
        "FAILED,OVERDUE",
        "0",
    ]
    assert lines[2].split()[:4] == ["ok", "2026-01-01T00:00:10+00:00", "succeeded", "node-1"]
    assert "broken: last error: RuntimeError: disk full" in lines
    check = run_cli("status", "--database-url", dsn, "--check")
    assert check.returncode == 1
    overdue = "overdue: the tick due at 2026-01-01T00:00:20+00:00 has no run"
    problems = check.stdout.splitlines()
    assert [line.split(" after it")[0].rsplit(" ", 2)[0] for line in problems] == [
        f"broken: {overdue}",
        "broken: last run failed (tick 2026-01-01T00:00:10+00:00): RuntimeError:",
        f"ok: {overdue}",
    ]
    assert problems[1].endswith("RuntimeError: disk full")


def test_status_shows_replicas_with_their_clock_offsets_and_frozen_holders(dsn: str) -> None:
    clock = FakeClock(z(2026, 1, 1))
    with Scheduler(clock=clock, backend=PostgresBackend(dsn), replica_id="node-1") as s:
        s.add_job(every(seconds=10), lambda: None, name="ok")
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as frozen:
        # What heartbeats write: node-2's clock runs 31.5 s ahead of the database's.
        conn.execute(
            "INSERT INTO replicron_replicas (namespace, replica_id, clock_offset_ms)"
            " VALUES ('', 'node-2', -31500)"
        )
        # node-2 is frozen: its run stopped heartbeating, its session still holds the lock.
        key = job_lock_key("ok")
        [(pid,)] = frozen.execute("SELECT pg_backend_pid() FROM pg_advisory_lock(%s)", [key])
        frozen.commit()
        conn.execute(
            "INSERT INTO replicron_runs (namespace, job, scheduled_at, replica_id, started_at,"
            " heartbeat_at, lock_key, backend_pid) VALUES ('', 'ok', '2026-01-01 00:00:20+00',"
            " 'node-2', now(), now() - interval '1 hour', %s, %s)",
            [key, pid],
        )
        result = run_cli("status", "--database-url", dsn)
        frozen.close()
        gone = run_cli("status", "--database-url", dsn)  # its session went: it blocks nothing
    assert "stopped heartbeating" not in gone.stdout
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.search(r"^ok: run \d+ of replica node-2 stopped heartbeating", result.stdout, re.M)
    header = lines.index("") + 1
    assert lines[header].split() == [
        "REPLICA",
        "ALIVE",
        "JOBS",
        "LAST",
        "SEEN",
        "CLOCK",
        "OFFSET",
    ]
    replicas = {line.split()[0]: line.split() for line in lines[header + 1 :] if line.strip()}
    assert replicas["node-2"][:3] == ["node-2", "yes", "0"]
    assert replicas["node-2"][-2:] == ["+31.500", "s"]
    # Stopped: counted, not listed.
    assert lines[header + 2].startswith("1 departed replica not listed (the latest, node-1,")


def test_unreachable_database_is_one_line_without_password() -> None:
    result = run_cli("status", "--database-url", "postgresql://u:topsecret@127.0.0.1:1/none")
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert "topsecret" not in result.stderr
    assert "cannot connect to PostgreSQL" in result.stderr
    missing = run_cli("migrate")
    assert missing.returncode == 2
    assert "--database-url" in missing.stderr


def test_sqlalchemy_urls_with_awkward_passwords_work_and_never_print(dsn: str) -> None:
    # SQLAlchemy's scheme names the driver; a "#" in a password is read as part of it.
    url = with_password(dsn, "ab#cd").replace("postgresql://", "postgresql+psycopg://", 1)
    migrated = run_cli("migrate", "--database-url", url)
    assert migrated.returncode == 0, migrated.stderr
    status = run_cli("status", "--database-url", url)
    assert status.returncode == 0, status.stderr
    printed = migrated.stdout + migrated.stderr + status.stdout + status.stderr
    assert "ab#cd" not in printed
    assert "postgresql+psycopg://postgres:***@" in migrated.stdout

    async def open_and_close() -> None:  # the backend takes the same URL
        backend = PostgresBackend(url)
        await backend.open("r1")
        await backend.close()

    asyncio.run(open_and_close())


def test_status_of_an_unmigrated_database_says_what_to_do(dsn: str) -> None:
    result = run_cli("status", "--database-url", dsn)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.endswith("has no replicron tables: run `replicron migrate` on it first\n")
    assert result.stderr.count("\n") == 1


def test_status_of_an_empty_namespace_lists_the_namespaces_with_runs(dsn: str) -> None:
    clock = FakeClock(z(2026, 1, 1))
    with Scheduler(clock=clock, backend=PostgresBackend(dsn, namespace="billing/")) as s:
        s.add_job(every(seconds=10), lambda: None, name="sync")
        clock.set(z(2026, 1, 1, 0, 0, 10))
        s.wait_idle()
    result = run_cli("status", "--database-url", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [
        "no runs recorded in namespace ''",
        "namespaces with runs: 'billing/' (1 runs); choose one with --namespace",
    ]


def test_registrations_of_dropped_jobs_go_by_replica_id_or_by_forget(dsn: str) -> None:
    clock = FakeClock(z(2026, 1, 1))
    old = Scheduler(clock=clock, backend=PostgresBackend(dsn), replica_id="web-1")
    for name in ("kept", "dropped", "moved"):
        old.add_job(every(seconds=10), lambda: None, name=name)
    with old:
        pass
    # The same replica id again (a restarted container), without two of the jobs: its rows
    # of them go as it starts; another replica's job is forgotten by hand.
    new = Scheduler(clock=clock, backend=PostgresBackend(dsn), replica_id="web-1")
    new.add_job(every(seconds=10), lambda: None, name="kept")
    other = Scheduler(clock=clock, backend=PostgresBackend(dsn), replica_id="web-2")
    other.add_job(every(seconds=10), lambda: None, name="moved")
    with other:
        pass
    with new:
        registered = {(v.job, v.scheduled_by) for v in new.cluster_status().jobs}
        assert registered == {("kept", ("web-1",)), ("moved", ())}
        refused = run_cli("forget", "kept", "--database-url", dsn)
        assert refused.returncode == 1
        assert "still scheduled by live replicas web-1" in refused.stdout
        forgotten = run_cli("forget", "moved", "--database-url", dsn)
        assert forgotten.returncode == 0, forgotten.stderr
        assert (
            forgotten.stdout == "forgot 'moved': no longer expected (it was registered by web-2)\n"
        )
        assert [v.job for v in new.cluster_status().jobs] == ["kept"]


def test_pause_refuses_a_job_no_replica_registered_in_its_namespace(dsn: str) -> None:
    clock = FakeClock(z(2026, 1, 1))
    scheduler = Scheduler(clock=clock, backend=PostgresBackend(dsn, namespace="shop/"))
    # Added before the start, which registers the jobs it has before it returns (one added
    # later is registered in the background, a moment after).
    scheduler.add_job(every(seconds=10), lambda: None, name="charge-card")
    with scheduler as s:
        clock.set(z(2026, 1, 1, 0, 0, 10))
        s.wait_idle()  # a run: the namespace has runs to be found by
        forgot_namespace = run_cli("pause", "charge-card", "--database-url", dsn)
        assert (forgot_namespace.returncode, forgot_namespace.stdout) == (2, "")
        assert forgot_namespace.stderr == (
            "replicron: error: no replica has registered a job named 'charge-card' in "
            "namespace ''; none is registered there; namespaces with runs: 'shop/' (choose "
            "one with --namespace); to pause a job not deployed yet, add --force\n"
        )
        shop = ("--database-url", dsn, "--namespace", "shop/")
        typo = run_cli("pause", "charge-crad", *shop)
        assert typo.returncode == 2
        assert typo.stderr == (
            "replicron: error: no replica has registered a job named 'charge-crad' in "
            "namespace 'shop/'; registered jobs: 'charge-card'; to pause a job not deployed "
            "yet, add --force\n"
        )
        resumed = run_cli("resume", "charge-crad", *shop)
        assert resumed.returncode == 2
        assert "named 'charge-crad' in namespace 'shop/'; registered jobs:" in resumed.stderr
        run_now = run_cli("run-now", "charge-crad", *shop)
        assert run_now.returncode == 2
        assert "named 'charge-crad' in namespace 'shop/'; registered jobs:" in run_now.stderr
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT * FROM replicron_paused").fetchall() == []

        forced = run_cli("pause", "refund", "--force", *shop)
        assert forced.returncode == 0, forced.stderr
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT namespace, job FROM replicron_paused").fetchall()
            assert rows == [("shop/", "refund")]
