"""pgbouncer in front of the suite's cluster, in transaction or session pool mode.

A replica's lock session must not go through a transaction pooler (its advisory locks would
not stay on one server session); a session pooler is fine. These instances let tests check
both. Each runs as the OS user postgres (pgbouncer refuses root) with trust authentication,
and forwards any database name to the cluster (``* = host=127.0.0.1 port=...``). It listens on
127.0.0.1 and on the host side of the namespace link, so a replica inside the namespace can
use it as well.

pgbouncer 1.18 does not support protocol-level prepared statements in transaction mode:
clients must not prepare (psycopg: ``prepare_threshold=None``).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tests.faults.workdir import chown_postgres

__all__ = ["PgBouncer", "PgBouncers", "PoolMode"]

PoolMode = Literal["transaction", "session"]


class PgBouncer:
    """One pgbouncer process in ``pool_mode`` on ``port``, in front of ``server_port``."""

    def __init__(
        self,
        workdir: Path,
        *,
        pool_mode: PoolMode,
        port: int,
        server_port: int,
        listen: Sequence[str] = ("127.0.0.1",),
        round_robin: bool = False,
        pgbouncer: str = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer",
    ) -> None:
        self.workdir, self.pool_mode, self.port = workdir, pool_mode, port
        self.server_port, self.listen, self.program = server_port, list(listen), pgbouncer
        # server_round_robin: idle server sessions handed out in turn, not the latest first.
        self.round_robin = round_robin
        name = f"pgbouncer-{pool_mode}{'-rr' if round_robin else ''}"
        self.config = workdir / f"{name}.ini"
        self.log_path = workdir / f"{name}.log"
        self.pidfile = workdir / f"{name}.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    def dsn(self, dbname: str, *, host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{dbname}"

    def start(self, timeout: float = 20.0) -> None:
        """Write the configuration, start pgbouncer, return once it accepts connections."""
        users = self.workdir / "pgbouncer-users.txt"
        users.write_text('"postgres" ""\n')
        self.config.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {','.join(self.listen)}\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.workdir}\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"pool_mode = {self.pool_mode}\n"
            "max_client_conn = 200\n"
            "default_pool_size = 20\n"
            f"server_round_robin = {int(self.round_robin)}\n"
            "admin_users = postgres\n"
            # psycopg and libpq send none of these, but other clients might.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log_path}\n"
            f"pidfile = {self.pidfile}\n"
        )
        for path in (users, self.config):
            chown_postgres(path)
        # Started directly as postgres (not through runuser, which would stay in between as
        # the parent): the pid is pgbouncer's own, and signals reach it.
        self._proc = subprocess.Popen(
            [self.program, str(self.config)],
            cwd=self.workdir,
            user="postgres",
            group="postgres",
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not self._accepts():
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"pgbouncer ({self.pool_mode}) exited {self._proc.returncode}:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer ({self.pool_mode}) did not listen in {timeout} s")
            time.sleep(0.05)

    def _accepts(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def stop(self) -> None:
        """Immediate shutdown (SIGTERM), then reap it."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill ends it: every connection through it breaks
        at once. :meth:`start` brings it back."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def __repr__(self) -> str:
        return f"PgBouncer({self.pool_mode!r}, port={self.port})"


@dataclass(frozen=True)
class PgBouncers:
    """The suite's pgbouncers: one per pool mode, and one more in transaction mode handing
    out its idle server sessions in turn."""

    transaction: PgBouncer
    session: PgBouncer
    transaction_round_robin: PgBouncer

    def __getitem__(self, mode: PoolMode) -> PgBouncer:
        return self.transaction if mode == "transaction" else self.session
