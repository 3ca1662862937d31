"""A primary and a streaming standby on this machine, and a failover from one to the other.

Two clusters of the suite's kind (:class:`~tests.faults.cluster.PgCluster`) on their own
ports: the primary, and a standby made from it with ``pg_basebackup -R`` that streams from a
physical replication slot. Replicas reach whichever is the primary through a multi-host DSN
(``host=127.0.0.1,127.0.0.1 port=P1,P2 target_session_attrs=read-write``).

``synchronous=True`` makes the standby synchronous (``synchronous_standby_names = '*'``,
``synchronous_commit = on``): a commit returns once the standby has flushed it. Otherwise the
standby is asynchronous, and :meth:`ReplicatedPair.fall_behind` cuts its stream off so that it
is really behind when the primary dies: whatever the primary commits after that is lost with
it.

:meth:`ReplicatedPair.failover` crashes the primary (``pg_ctl stop -m immediate``) and
promotes the standby; :meth:`ReplicatedPair.rebuild` makes a new standby of the new primary on
the old primary's port, so that the DSN stays valid and the pair can fail over again.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from tests.faults.cluster import Database, PgCluster
from tests.faults.workdir import as_postgres, chown_postgres, free_port

__all__ = ["FailoverDatabase", "ReplicatedPair"]

SLOT = "replicron_standby"


class ReplicatedPair:
    """A primary and its standby under ``workdir``, on two free ports."""

    def __init__(self, workdir: Path, bindir: Path, *, synchronous: bool) -> None:
        self.workdir, self.bindir, self.synchronous = workdir, bindir, synchronous
        first = free_port()
        second = free_port()
        while second == first:
            second = free_port()
        self.ports = (first, second)
        self.primary = self._cluster(0)
        self.standby: PgCluster | None = None
        #: How many times the pair failed over.
        self.failovers = 0

    def _cluster(self, n: int) -> PgCluster:
        path = self.workdir / f"node{n}-{uuid.uuid4().hex[:6]}"
        path.mkdir(mode=0o755)
        chown_postgres(path)
        return PgCluster(path, self.bindir, port=self.ports[n])

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """initdb and start the primary, then make and start its standby."""
        self.primary.init()
        with (self.primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "# replication\nsynchronous_commit = on\nwal_level = replica\n"
                "max_wal_senders = 4\nmax_replication_slots = 4\nwal_sender_timeout = 5s\n"
                "wal_receiver_status_interval = 1s\n"
            )
        with (self.primary.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 0.0.0.0/0 trust\nlocal replication all trust\n")
        self.primary.start()
        self._attach_standby()

    def _attach_standby(self) -> None:
        """A standby of the primary on the other port, streaming from the slot (and
        synchronous, if the pair is)."""
        n = 1 - self.ports.index(self.primary.port)
        standby = self._cluster(n)
        with self.primary.admin() as admin:
            admin.execute(
                "SELECT pg_create_physical_replication_slot(%s)"
                " WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s)",
                (SLOT, SLOT),
            )
        self._run(
            "pg_basebackup",
            "-D",
            str(standby.data),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-R",
            "-S",
            SLOT,
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        with (standby.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"# the standby\nport = {standby.port}\n"
                f"unix_socket_directories = '{standby.workdir}'\ncluster_name = 'standby'\n"
            )
        (standby.data / "postmaster.pid").unlink(missing_ok=True)
        standby.start()
        self.standby = standby
        if self.synchronous:
            self._set(self.primary, "synchronous_standby_names", "'*'")
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the standby streams from the primary (and, synchronous, is its sync one)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.primary.admin() as admin:
                states = admin.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchall()
            if (want,) in states:
                return
            time.sleep(0.05)
        raise AssertionError(f"the standby did not stream ({want}) within {timeout} s")

    def _set(self, cluster: PgCluster, name: str, value: str) -> None:
        with cluster.admin() as admin:
            admin.execute(f"ALTER SYSTEM SET {name} = {value}")
            admin.execute("SELECT pg_reload_conf()")

    def fall_behind(self) -> None:
        """Asynchronous pair: cut the standby's stream off, so it stays where it is until the
        failover (what the primary commits from now on is lost with it)."""
        assert self.standby is not None
        assert not self.synchronous
        with self.standby.admin() as admin:
            admin.execute("ALTER SYSTEM SET primary_conninfo = ''")
            admin.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self.primary.admin() as admin:
                [(streaming,)] = admin.execute("SELECT count(*) FROM pg_stat_replication")
            if not streaming:
                return
            time.sleep(0.02)
        raise AssertionError("the standby still streams")

    def failover(self) -> float:
        """Crash the primary (``stop -m immediate``) and promote the standby; returns when
        the promotion was done (monotonic). The new primary runs without a synchronous
        standby until :meth:`rebuild` gives it one."""
        standby = self.standby
        assert standby is not None
        self.primary._pg_ctl("stop", "-m", "immediate")
        standby._pg_ctl("promote")
        promoted = time.monotonic()
        if self.synchronous:  # no standby left to wait for: commits would hang
            self._set(standby, "synchronous_standby_names", "''")
        self.old_primary, self.primary, self.standby = self.primary, standby, None
        self.failovers += 1
        return promoted

    def rebuild(self) -> None:
        """A new standby of the new primary, on the old primary's port (which is freed)."""
        old = self.old_primary
        shutil.rmtree(old.workdir, ignore_errors=True)
        with self.primary.admin() as admin:
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s AND NOT active",
                (SLOT,),
            )
        self._attach_standby()

    def dsn(self, dbname: str) -> str:
        """The replicas' multi-host DSN: whichever of the two accepts writes."""
        first, second = self.ports
        return (
            f"host=127.0.0.1,127.0.0.1 port={first},{second} dbname={dbname} user=postgres "
            "target_session_attrs=read-write"
        )

    def url(self, dbname: str) -> str:
        first, second = self.ports
        return (
            f"postgresql://postgres@127.0.0.1:{first},127.0.0.1:{second}/{dbname}"
            "?target_session_attrs=read-write&connect_timeout=5"
        )

    def identity(self) -> tuple[int, int]:
        """The primary's (system identifier, timeline)."""
        with self.primary.admin() as admin:
            [(system, timeline)] = admin.execute(
                "SELECT system_identifier,"
                " ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
                " FROM pg_control_system()"
            ).fetchall()
        return int(system), int(timeline)

    def close(self) -> None:
        for cluster in (self.primary, self.standby, getattr(self, "old_primary", None)):
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.close()

    def log_tails(self) -> str:
        return "\n".join(
            f"--- {cluster.workdir.name} (port {cluster.port}) ---\n{cluster.log_tail(40)}"
            for cluster in (self.primary, self.standby, getattr(self, "old_primary", None))
            if cluster is not None
        )

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            as_postgres([str(self.bindir / program), *args]),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{program} exited {result.returncode}: {result.stderr}")


class FailoverDatabase(Database):
    """The test's view of its database on whichever node is the primary."""

    def __init__(self, pair: ReplicatedPair, dbname: str) -> None:
        super().__init__(pair.primary, pair.url(dbname))
        self.name = dbname
        self.pair = pair

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + 20
        while True:
            try:
                return super().rows(query, params)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @classmethod
    def create(cls, pair: ReplicatedPair) -> FailoverDatabase:
        name = f"failover_{uuid.uuid4().hex[:12]}"
        with pair.primary.admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return cls(pair, name)
