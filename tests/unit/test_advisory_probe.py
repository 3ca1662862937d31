"""The advisory-lock probe against servers that answer as PostgreSQL, CockroachDB and
YugabyteDB do (their documented answers, played by fakes: none of them runs here; the probe
on a real PostgreSQL is in tests/postgres/test_advisory_probe_postgres.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import psycopg.errors
import pytest

from replicron.errors import ConfigurationError, UntrustedAdvisoryLocksError
from replicron.postgres import BackendUnavailableError
from replicron.postgres import UntrustedAdvisoryLocksError as ExportedError
from replicron.postgres._probe import check_advisory_locks

POSTGRES = (
    "PostgreSQL 16.4 on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14) 12.2.0, 64-bit"
)
COCKROACH = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
YUGABYTE = (
    "PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 16.0.6, "
    "64-bit"
)
LEASE = 'coordination="lease"'


class FakeServer:
    """Session advisory locks as a server keeps them: ``mode`` says how they behave."""

    def __init__(self, version: str, mode: str = "postgres") -> None:
        self.version = version
        self.mode = mode
        self.owner: dict[tuple[int, int], FakeSession] = {}
        self.sessions: list[FakeSession] = []
        self.calls: list[tuple[int, str, tuple[int, int]]] = []  # (session, function, key)
        self.blocked = asyncio.Event()  # mode "hang": the second session's try got here

    async def open(self) -> FakeSession:
        session = FakeSession(self, len(self.sessions))
        self.sessions.append(session)
        return session


class FakeSession:
    def __init__(self, server: FakeServer, number: int) -> None:
        self.server = server
        self.number = number
        self.closed = False

    async def fetch_one(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        assert not self.closed
        server = self.server
        if "version()" in sql:
            return (server.version,)
        key = (params["k1"], params["k2"])
        function = "try" if "pg_try_advisory_lock" in sql else "unlock"
        assert function == "try" or "pg_advisory_unlock" in sql
        server.calls.append((self.number, function, key))
        if server.mode == "disabled":
            raise psycopg.errors.FeatureNotSupported("advisory locks are not yet implemented")
        if server.mode == "silenced":
            return (None,)
        if server.mode == "always":
            return (True,)
        if server.mode == "lost":
            raise BackendUnavailableError("lost the advisory-lock probe: server closed")
        if server.mode == "hang" and function == "try" and self.number == 1:
            server.blocked.set()
            await asyncio.Event().wait()  # the answer never comes
        if function == "try":
            if server.owner.get(key, self) is not self:
                return (False,)
            server.owner[key] = self
            return (True,)
        if server.owner.get(key) is not self or server.mode == "unlock_false":
            return (False,)
        del server.owner[key]
        return (True,)

    async def close(self) -> None:
        self.closed = True
        for key in [key for key, owner in self.server.owner.items() if owner is self]:
            del self.server.owner[key]


def refusal(server: FakeServer) -> UntrustedAdvisoryLocksError:
    with pytest.raises(UntrustedAdvisoryLocksError) as caught:
        asyncio.run(check_advisory_locks(server.open))
    return caught.value


def assert_closed(server: FakeServer) -> None:
    assert len(server.sessions) == 2
    assert all(session.closed for session in server.sessions)


def test_postgresql_passes_and_follows_the_protocol() -> None:
    server = FakeServer(POSTGRES)
    asyncio.run(check_advisory_locks(server.open))
    assert [(n, f) for n, f, _ in server.calls] == [
        (0, "try"),
        (1, "try"),
        (0, "unlock"),
        (1, "try"),
        (1, "unlock"),
    ]
    keys = {key for _, _, key in server.calls}
    assert len(keys) == 1  # one key throughout, in the two-int space
    assert all(-(2**31) <= part < 2**31 for part in keys.pop())
    assert_closed(server)
    assert server.owner == {}


def test_the_key_is_random() -> None:
    servers = [FakeServer(POSTGRES) for _ in range(3)]
    for server in servers:
        asyncio.run(check_advisory_locks(server.open))
    assert len({server.calls[0][2] for server in servers}) == 3


def test_cockroachdb_is_refused_by_name() -> None:
    server = FakeServer(COCKROACH, "always")
    error = refusal(server)
    assert error.server == "CockroachDB"
    assert "CockroachDB" in str(error)
    assert LEASE in str(error)
    assert "a second session also got the lock" in str(error)
    assert_closed(server)
    # Both sessions were told to unlock what they may hold before closing.
    assert {(n, f) for n, f, _ in server.calls if f == "unlock"} == {(0, "unlock"), (1, "unlock")}


def test_lease_mode_is_named_as_the_code_that_built_the_backend_sets_it() -> None:
    toml = 'coordination = "lease" in [scheduler]'
    server = FakeServer(COCKROACH, "always")
    with pytest.raises(UntrustedAdvisoryLocksError) as caught:
        asyncio.run(check_advisory_locks(server.open, lease_setting=toml))
    assert toml in str(caught.value)
    assert "PostgresBackend" not in str(caught.value)


def test_yugabytedb_with_advisory_locks_disabled_is_refused() -> None:
    server = FakeServer(YUGABYTE, "disabled")
    error = refusal(server)
    assert error.server == "YugabyteDB"
    assert "YugabyteDB" in str(error)
    assert LEASE in str(error)
    assert "FeatureNotSupported" in str(error)
    assert "not yet implemented" in str(error)
    assert isinstance(error.__cause__, psycopg.errors.FeatureNotSupported)
    assert_closed(server)


def test_yugabytedb_with_the_error_silenced_is_refused() -> None:
    server = FakeServer(YUGABYTE, "silenced")
    error = refusal(server)
    assert "YugabyteDB" in str(error)
    assert LEASE in str(error)
    assert "could not take a free advisory lock" in str(error)
    assert "NULL" in str(error)
    assert_closed(server)


def test_yugabytedb_silenced_answering_true_is_refused() -> None:
    error = refusal(FakeServer(YUGABYTE, "always"))
    assert "YugabyteDB" in str(error)
    assert LEASE in str(error)
    assert "a second session also got the lock" in str(error)


def test_an_unlock_answering_false_is_refused() -> None:
    server = FakeServer(POSTGRES, "unlock_false")
    error = refusal(server)
    assert error.server == "PostgreSQL 16.4"
    assert "PostgreSQL 16.4" in str(error)
    assert LEASE in str(error)
    assert "pg_advisory_unlock of a held lock returned false" in str(error)
    assert_closed(server)
    assert server.owner == {}


def test_an_unnamed_server_is_refused_by_what_was_seen() -> None:
    error = refusal(FakeServer("", "always"))
    assert error.server is None
    assert "on this server: a second session also got the lock" in str(error)
    assert LEASE in str(error)


def test_the_error_is_a_configuration_error_exported_by_the_backend() -> None:
    assert ExportedError is UntrustedAdvisoryLocksError
    assert issubclass(UntrustedAdvisoryLocksError, ConfigurationError)


def test_a_lost_session_is_not_a_refusal() -> None:
    server = FakeServer(POSTGRES, "lost")
    with pytest.raises(BackendUnavailableError) as caught:
        asyncio.run(check_advisory_locks(server.open))
    assert not isinstance(caught.value, UntrustedAdvisoryLocksError)
    assert_closed(server)


def test_a_second_session_that_cannot_connect_is_not_a_refusal() -> None:
    server = FakeServer(POSTGRES)

    async def open_once() -> FakeSession:
        if server.sessions:
            raise BackendUnavailableError("cannot open the advisory-lock probe: refused")
        return await server.open()

    with pytest.raises(BackendUnavailableError, match="refused"):
        asyncio.run(check_advisory_locks(open_once))
    assert len(server.sessions) == 1
    assert server.sessions[0].closed


def test_cancelled_mid_probe_it_unlocks_and_closes_both() -> None:
    server = FakeServer(POSTGRES, "hang")

    async def main() -> None:
        probe = asyncio.ensure_future(check_advisory_locks(server.open))
        await server.blocked.wait()
        unlocks_before = [call for call in server.calls if call[1] == "unlock"]
        assert unlocks_before == []
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe

    asyncio.run(main())
    assert_closed(server)
    # Session 0 held the lock: it unlocked it itself, before closing.
    assert (0, "unlock") in {(n, f) for n, f, _ in server.calls}
    assert server.owner == {}
