"""A pgbouncer in transaction mode in front of a bench's server, for bench/pg_fleet.py
``--pgbouncer``: started as the ``postgres`` user (pgbouncer refuses root) in a directory of
its own, stopped and removed at the end."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PgBouncer"]


class PgBouncer:
    """``pool_size`` server connections per database, shared by every client."""

    def __init__(self, server_host: str, server_port: int, pool_size: int) -> None:
        self.server_host, self.server_port, self.pool_size = server_host, server_port, pool_size
        self.port = _free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="replicron-bench-pgbouncer."))
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 20.0) -> None:
        program = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        users, config = self.workdir / "users.txt", self.workdir / "pgbouncer.ini"
        users.write_text('"postgres" ""\n')
        config.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.workdir}\n"
            f"auth_type = trust\nauth_file = {users}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 2000\n"
            f"default_pool_size = {self.pool_size}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.workdir / 'pgbouncer.log'}\n"
        )
        user = None if os.geteuid() != 0 else pwd.getpwnam("postgres")
        if user is not None:
            for path in (self.workdir, users, config):
                os.chown(path, user.pw_uid, user.pw_gid)
        self._proc = subprocess.Popen(
            [program, str(config)],
            cwd=self.workdir,
            user=None if user is None else user.pw_uid,
            group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not _accepts(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start; see {self.workdir}/pgbouncer.log")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
