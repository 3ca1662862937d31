"""Whether the server's session advisory locks can be trusted, tried before relying on them.

Servers that speak PostgreSQL's protocol do not all lock: CockroachDB's
``pg_try_advisory_lock`` succeeds for every session at once, YugabyteDB's raise "not yet
implemented" or, with ``yb_silence_advisory_locks_not_supported_error``, do nothing and
succeed. The version string cannot be relied on (a Citus coordinator locks fine; a fork may
say nothing), so the probe asks the locks themselves, on two sessions of their own: A takes a
free key, B must be refused it, A's unlock must succeed, then B takes it and unlocks it. Any
other answer, or an error from these functions, refuses the server. A session that could not
be opened or stopped answering is not a refusal: it raises
:class:`~replicron.postgres.BackendUnavailableError`, as any other connection failure does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from replicron.errors import UntrustedAdvisoryLocksError

from ._secrets import scrub
from ._session import BackendUnavailableError, _CannotConnect, connect_failure
from ._setting_names import PYTHON_NAMES
from ._sql import queries

__all__ = [
    "ProbeSession",
    "PsycopgProbeSession",
    "UntrustedAdvisoryLocksError",
    "check_advisory_locks",
    "open_probe_session",
]

logger = logging.getLogger(__name__)


class ProbeSession(Protocol):
    """One server session of the probe."""

    async def fetch_one(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The statement's first row (``None`` for none). An error the server answered with
        is raised as it is (a ``psycopg.Error``); a lost or silent session raises
        :class:`BackendUnavailableError`."""
        ...

    async def close(self) -> None: ...


class PsycopgProbeSession:
    """A :class:`ProbeSession` over an autocommit ``psycopg.AsyncConnection``; every statement
    has ``deadline`` seconds to answer."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], deadline: float) -> None:
        self.conn = conn
        self.deadline = deadline

    async def fetch_one(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        try:
            return await asyncio.wait_for(self._fetch_one(sql, params), self.deadline)
        except TimeoutError as exc:
            raise BackendUnavailableError(
                f"the advisory-lock probe got no answer within {self.deadline:g} s"
            ) from exc
        except psycopg.Error as exc:
            if self.conn.broken or self.conn.closed:
                raise BackendUnavailableError(f"lost the advisory-lock probe: {exc}") from exc
            raise  # the server answered with an error: the probe judges it

    async def _fetch_one(self, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        cursor = await self.conn.execute(sql.encode(), params)
        return await cursor.fetchone()

    async def close(self) -> None:
        try:
            await self.conn.close()
        except Exception:  # the connection is broken anyway
            logger.debug("closing the advisory-lock probe failed", exc_info=True)


async def open_probe_session(conninfo: str, connect_timeout: float) -> PsycopgProbeSession:
    """A direct autocommit session for :func:`check_advisory_locks`. As for the lock session,
    a failure to connect raises :class:`BackendUnavailableError` (its password scrubbed)."""
    try:
        conn = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(
                conninfo,
                autocommit=True,
                prepare_threshold=None,
                application_name="replicron advisory-lock probe",
                connect_timeout=max(1, int(connect_timeout)),
            ),
            connect_timeout,
        )
    except (psycopg.Error, TimeoutError, OSError) as exc:
        scrub(exc, conninfo)  # libpq may quote the connection string
        raise _CannotConnect(
            connect_failure("cannot open the advisory-lock probe", exc, connect_timeout)
        ) from exc
    return PsycopgProbeSession(conn, connect_timeout)


async def check_advisory_locks(
    open_session: Callable[[], Awaitable[ProbeSession]], *, lease_setting: str = PYTHON_NAMES.lease
) -> None:
    """Raise :class:`UntrustedAdvisoryLocksError` (naming lease mode as ``lease_setting``
    says) unless session advisory locks exclude one another on the server that
    ``open_session`` connects to.

    Two sessions are opened with ``open_session`` and always closed again, and whatever lock
    the probe may hold is unlocked first, whether the probe passes, refuses, fails or is
    cancelled. Errors of ``open_session`` and :class:`BackendUnavailableError` propagate.
    """
    sessions = [await open_session()]
    holding: list[ProbeSession] = []  # the sessions that may hold the probe's lock
    key = {"k1": _random_int4(), "k2": _random_int4()}
    try:
        sessions.append(await open_session())
        await _probe(sessions[0], sessions[1], key, holding, lease_setting)
    finally:
        try:
            for session in holding:
                with contextlib.suppress(Exception):
                    await session.fetch_one(queries()["probe_unlock"], key)
        finally:
            await _close_all(sessions)


async def _probe(
    a: ProbeSession,
    b: ProbeSession,
    key: Mapping[str, int],
    holding: list[ProbeSession],
    lease_setting: str,
) -> None:
    server = _server_name(await _version(a))

    def untrusted(observed: str) -> UntrustedAdvisoryLocksError:
        return UntrustedAdvisoryLocksError(observed, server, lease_setting=lease_setting)

    async def ask(session: ProbeSession, query: str) -> object:
        function = "pg_try_advisory_lock" if query == "probe_try_lock" else "pg_advisory_unlock"
        if query == "probe_try_lock":
            holding.append(session)  # before asking: a lost answer may still have locked
        try:
            row = await session.fetch_one(queries()[query], key)
        except psycopg.Error as exc:
            message = " ".join(str(exc).split())
            raise untrusted(f"{function} raised {type(exc).__name__}: {message}") from exc
        answer = row[0] if row else None
        if (query == "probe_try_lock") != (answer is True):
            holding.remove(session)  # a refused lock, or an unlock
        return answer

    answer = await ask(a, "probe_try_lock")
    if answer is not True:
        raise untrusted(
            f"a session could not take a free advisory lock (pg_try_advisory_lock returned "
            f"{_sql(answer)})"
        )
    answer = await ask(b, "probe_try_lock")
    if answer is True:
        raise untrusted("a second session also got the lock")
    if answer is not False:
        raise untrusted(f"a second session asking for a held lock got {_sql(answer)}, not false")
    answer = await ask(a, "probe_unlock")
    if answer is not True:
        raise untrusted(f"pg_advisory_unlock of a held lock returned {_sql(answer)}, not true")
    answer = await ask(b, "probe_try_lock")
    if answer is not True:
        raise untrusted(
            f"a lock just unlocked could not be taken by another session "
            f"(pg_try_advisory_lock returned {_sql(answer)})"
        )
    answer = await ask(b, "probe_unlock")
    if answer is not True:
        raise untrusted(f"pg_advisory_unlock of a held lock returned {_sql(answer)}, not true")


async def _version(session: ProbeSession) -> str | None:
    try:
        row = await session.fetch_one(queries()["probe_version"], {})
    except psycopg.Error:  # the locks decide; the version only names the server
        return None
    return str(row[0]) if row and row[0] is not None else None


def _server_name(version: str | None) -> str | None:
    """The server a version string names: CockroachDB and YugabyteDB by name, another by the
    start of its string ("PostgreSQL 16.4")."""
    if not version:
        return None
    lowered = version.lower()
    if "cockroachdb" in lowered:
        return "CockroachDB"
    if "yugabyte" in lowered or "-yb-" in lowered:
        return "YugabyteDB"
    return version.split(" on ", 1)[0].split(",", 1)[0].strip()[:60] or None


def _sql(answer: object) -> str:
    if answer is None:
        return "NULL (nothing)"
    if isinstance(answer, bool):
        return str(answer).lower()
    return repr(answer)


def _random_int4() -> int:
    return secrets.randbelow(2**32) - 2**31


async def _close_all(sessions: Sequence[ProbeSession]) -> None:
    """Close every session, even if closing one is cancelled or fails."""
    if not sessions:
        return
    try:
        await sessions[0].close()
    finally:
        await _close_all(sessions[1:])
