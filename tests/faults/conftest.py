"""Fixtures of the fault-injection suite: its own PostgreSQL cluster, pgbouncers, a network
namespace, a fresh database per test, and replica processes.

Session-scoped (started once, torn down at the end even when tests fail): ``pg`` (the cluster),
``pgbouncers`` (transaction and session mode; started only if a test asks), and the network
namespace, each on ports and addresses chosen for the session, so that sessions can run side
by side.
Per test: ``coordination`` (the replicas' mode: ``"advisory"``, or each mode in turn for a
test marked ``@both_modes`` from :mod:`tests.faults.fleet`), ``db`` (a fresh database, dropped
with its sessions afterwards), ``netns`` (healed after the test), ``replicas`` (a
:class:`~tests.faults.fleet.Fleet`; every process is reaped at the end) and ``summary``.

A scenario, in short::

    def test_something(replicas: Fleet, netns: NetworkNamespace, summary) -> None:
        replicas.start("r1", jobs=4, every_s=1, task_ms=100)
        replicas.start("r2", jobs=4, every_s=1, task_ms=100, in_namespace=True)
        replicas.start("r3", jobs=4, every_s=1, task_ms=100, faketime="+30s", via="session")
        ready = replicas.wait_ready(["r1", "r2", "r3"])
        netns.partition()  # ... the fault; replicas.kill/pause/resume, pg.restart() ...
        window = Window.from_monotonic(max(ready.values()) + 0.5, time.monotonic() - 0.5)
        replicas.stop()
        summary(f"[partition of r2] {replicas.assert_invariants(window)}")

Every test here is marked ``faults`` and ``slow`` (tests/conftest.py). Missing prerequisites
(root, ip, nft, pgbouncer, libfaketime, initdb) skip the tests, or fail them when ``CI`` is set.
A failed test's report shows the replicas' logs and the end of the PostgreSQL log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._harness.reporting import report_on_failure
from tests.faults.cluster import Database, PgCluster
from tests.faults.fleet import Fleet
from tests.faults.netns import NetworkNamespace
from tests.faults.pooler import PgBouncer, PgBouncers, PoolMode
from tests.faults.prereqs import postgres_bin, require
from tests.faults.workdir import NAMESPACE_FILE, free_port, suite_directory

# ---- session: the machinery ------------------------------------------------------------------


@pytest.fixture(scope="session")
def suite_dir() -> Iterator[Path]:
    """A directory owned by postgres for the session's cluster and pgbouncers. Checks the
    whole suite's needs at once, so that one message names everything that is missing."""
    require("root", "runuser", "postgres-user", "initdb", "ip", "nft", "pgbouncer", "libfaketime")
    bindir = postgres_bin()
    assert bindir is not None
    with suite_directory(bindir / "pg_ctl") as path:
        yield path


@pytest.fixture(scope="session")
def namespace(suite_dir: Path) -> Iterator[NetworkNamespace]:
    """The replica namespace and its link, named after the session's directory."""
    require("root", "ip", "nft")
    tag = "".join(c for c in suite_dir.name.removeprefix("run-") if c.isalnum())[:8]
    ns = NetworkNamespace(tag)
    (suite_dir / NAMESPACE_FILE).write_text(ns.name)  # for whoever clears it after a crash
    ns.create()
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture(scope="session")
def pg(suite_dir: Path, namespace: NetworkNamespace) -> Iterator[PgCluster]:
    """The suite's PostgreSQL cluster, listening on 127.0.0.1 and the namespace link."""
    bindir = postgres_bin()
    assert bindir is not None
    listen = ["127.0.0.1", namespace.host_address]
    cluster = PgCluster(suite_dir, bindir, port=free_port(listen), listen=listen)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def pgbouncers(suite_dir: Path, pg: PgCluster, namespace: NetworkNamespace) -> Iterator[PgBouncers]:
    """pgbouncer in transaction mode and in session mode, both in front of ``pg``."""
    require("pgbouncer")
    listen = ["127.0.0.1", namespace.host_address]
    modes: tuple[tuple[PoolMode, bool], ...] = (
        ("transaction", False),
        ("session", False),
        ("transaction", True),
    )
    started = []
    try:
        for mode, round_robin in modes:
            bouncer = PgBouncer(
                suite_dir,
                pool_mode=mode,
                port=free_port(listen),
                server_port=pg.port,
                listen=listen,
                round_robin=round_robin,
            )
            bouncer.start()
            started.append(bouncer)
        yield PgBouncers(*started)
    finally:
        for bouncer in started:
            bouncer.stop()


# ---- per test --------------------------------------------------------------------------------


@pytest.fixture
def netns(namespace: NetworkNamespace) -> Iterator[NetworkNamespace]:
    """The replica namespace; a partition a test leaves in place is healed after it."""
    try:
        yield namespace
    finally:
        namespace.heal()


@pytest.fixture
def db(request: pytest.FixtureRequest, pg: PgCluster) -> Iterator[Database]:
    """A fresh database for the test on the suite's cluster, dropped afterwards (with its
    sessions; the cluster is started again first if the test left it down)."""
    report_on_failure(request, "postgres log (tail)", lambda: pg.log_tail(80))
    database = Database(pg, pg.create_database())
    try:
        yield database
    finally:
        database.close()
        pg.drop_database(database.name)


@pytest.fixture
def coordination() -> str:
    """The replicas' coordination mode: advisory, unless a test runs in both
    (``@both_modes``, which parametrizes this name)."""
    return "advisory"


@pytest.fixture
def replicas(
    request: pytest.FixtureRequest,
    db: Database,
    netns: NetworkNamespace,
    tmp_path: Path,
    coordination: str,
) -> Iterator[Fleet]:
    """Starts replica processes for the test (see :meth:`Fleet.start`); reaps them all."""

    def pgbouncer(mode: PoolMode) -> PgBouncer:
        bouncers = request.getfixturevalue("pgbouncers")
        assert isinstance(bouncers, PgBouncers)
        return bouncers[mode]

    fleet = Fleet(db, tmp_path, netns=netns, pgbouncer=pgbouncer, coordination=coordination)
    report_on_failure(request, "replica logs", fleet.logs)
    try:
        yield fleet
    finally:
        fleet.close()
