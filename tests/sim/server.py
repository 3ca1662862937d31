"""The simulated PostgreSQL server: the reference ledger behind sessions and a network.

Each client connection reaches a server session of its own over its process's link. A
statement travels to the server (in order, after the link's delay), runs there on the
reference ledger at the server's instant, and its answer travels back; a link may lose either
way, or everything while it is cut. Closing a connection ends its server session when the
close arrives; a killed process's sessions end when the server notices (keepalives). The
ledger's named statements are answered by the reference ledger; what the session code sends
around them (its settings, the pooler probe, the migration's bookkeeping on a migrated
schema) is answered here.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors

from replicron.postgres._bounds import BOUND_STATEMENT
from replicron.postgres._reference import ReferenceLedger, ServerSession, StatementError
from replicron.postgres._reference.server import AdvisoryLocks
from replicron.postgres._sql import migrations, queries

from .world import Process, World

__all__ = ["Link", "Server", "SimConnection"]

#: The named statements that return no rows (no RETURNING): a cursor without a description.
_NO_ROWS = frozenset({"replica_joined", "replica_stopped", "prune_registry", "leader_resign"})
_SET_UP = re.compile(r"^SELECT pg_backend_pid\(\), set_config\('replicron.session_token'")
_WHO = "SELECT pg_backend_pid(), current_setting('replicron.session_token', true)"
#: How long after it arrived a statement its client gave up on may still run on the server:
#: the backend's statement deadline with the defaults (half a run's lease), which the
#: server's own timeout repeats, and a second to spare.
LEFT_ON_THE_SERVER = 5.0 + 1.0


@dataclass
class Link:
    """A process's network path to the server: each message's delay, and its faults."""

    world: World
    process: Process
    #: Until when (monotonic) every message either way is lost.
    cut_until: float = -1.0
    #: The chance that a message is lost, each way.
    loss: float = 0.0
    #: Each message's delay is drawn from this (seconds).
    delay: Callable[[], float] = field(default=lambda: 0.001)
    _last: float = 0.0

    def lost(self) -> bool:
        return self.world.now < self.cut_until or (
            self.loss > 0 and self.world.rng.random() < self.loss
        )

    def arrival(self) -> float:
        """When a message sent now arrives: after its delay, never before an earlier one."""
        self._last = max(self.world.now + self.delay(), self._last + 1e-6)
        return self._last


class Server:
    """The database server: the reference ledger and the sessions on it."""

    def __init__(self, world: World, start: datetime) -> None:
        self.world = world
        self.ledger = ReferenceLedger(start)
        self._probe_locks = AdvisoryLocks()  # the two-int key space of the pooler probe
        self._names = {text: name for name, text in queries().items()}
        self._versions = [(m.version,) for m in migrations()]
        self.statements = 0
        #: When given, each statement is told to it: (instant, session pid, name, answer).
        self.tell: Callable[[str], None] | None = None
        #: The runs whose outcomes a release brought to the server (written or refused).
        self.released: set[int] = set()
        #: Until when (monotonic) the ledger's tables are locked by somebody else.
        self.locked_until = -1.0
        self._gave_up: dict[int, float] = {}
        self._bound: dict[int, float] = {}
        #: What the server saw that breaks the protocol's bounds (checked like an invariant).
        self.violations: list[str] = []

    def instant(self) -> datetime:
        return self.world.instant()

    # ---- statements that wait on the server ------------------------------------------------

    def lock_ledger(self, seconds: float) -> None:
        """Somebody holds a lock on the ledger's tables (a long migration, ``LOCK TABLE``):
        the statements on them wait until it is released or their ``statement_timeout``
        (``lock_timeout``) ends them, whether or not their client is still there."""
        self.locked_until = max(self.locked_until, self.world.now + seconds)

    def gave_up(self, session: ServerSession) -> None:
        """The client of ``session`` gave up on it (its statement's deadline passed)."""
        self._gave_up.setdefault(session.pid, self.world.now)

    def arrive(
        self,
        session: ServerSession,
        text: str,
        params: Any,
        answered: Callable[[Any, BaseException | None], None],
    ) -> None:
        """A statement reaches the server: run now, or once the ledger's lock is released
        (within the statement's timeout: else the server cancels it)."""
        timeout = self._timeout_of(session, text, params)
        if self.world.now >= self.locked_until or self._names.get(text) is None:
            self._answer(session, text, params, answered)
            return
        arrived = self.world.now

        def waited() -> None:
            if self.world.now < self.locked_until:
                answered(
                    None, psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
                )
                return
            gave_up = self._gave_up.get(session.pid)
            if gave_up is not None and self.world.now > arrived + LEFT_ON_THE_SERVER:
                name = self._names[text]
                self.violations.append(
                    f"bounds: {name} of server pid {session.pid} ran on the server "
                    f"{self.world.now - arrived:.1f} s after it arrived, though its client "
                    f"had given up on it at {gave_up:.3f}"
                )
            self._answer(session, text, params, answered, ended_by_client=gave_up is not None)

        until = self.locked_until if timeout is None else min(self.locked_until, arrived + timeout)
        self.world.call_at(until, waited)

    def _timeout_of(self, session: ServerSession, text: str, params: Any) -> float | None:
        """The server's bound on this statement (seconds): the one set for its own
        transaction by the statement before it, else the session's ``statement_timeout``."""
        if text == BOUND_STATEMENT:
            self._bound[session.pid] = int(params["timeout"]) / 1000
            return None
        bound = self._bound.pop(session.pid, None)
        if bound is not None:
            return bound
        setting = session.settings.get("statement_timeout")
        return int(setting) / 1000 if setting else None

    def _answer(
        self,
        session: ServerSession,
        text: str,
        params: Any,
        answered: Callable[[Any, BaseException | None], None],
        ended_by_client: bool = False,
    ) -> None:
        # A session its client closed lives on the server until its statement is over.
        reopened = ended_by_client and session.closed
        if reopened:
            session.closed = False
        try:
            result: Any = self.run(session, text, params)
            failure: BaseException | None = None
        except Exception as exc:  # the server's answer is an error
            result, failure = None, exc
        if reopened:
            self.end(session)
        answered(result, failure)

    def open(self) -> ServerSession:
        return self.ledger.connect()

    def restart(self) -> None:
        """Every session ends (what was committed stays)."""
        for session in list(self.ledger.sessions()):
            self.end(session)

    def end(self, session: ServerSession) -> None:
        if not session.closed:
            self.ledger.disconnect(session)
            self._probe_locks.session_ended(session)

    def run(self, session: ServerSession, text: str, params: Any) -> tuple[list[Any], bool]:
        """A statement on ``session``: its rows and whether it has a description."""
        if session.closed:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        self.statements += 1
        self.ledger.db.now = self.instant()
        name = self._names.get(text)
        if name is None:
            return self._plumbing(session, text.strip(), params)
        if name in ("release", "lease_release"):
            self.released.update(run_id for run_id in params["run_ids"] if run_id is not None)
        try:
            answer = self._named(name, session, dict(params or {}))
        except Exception as exc:
            self._told(session, name, params, repr(exc))
            raise
        self._told(session, name, params, answer[0])
        return answer

    def _told(self, session: ServerSession, name: str, params: Any, answer: Any) -> None:
        if self.tell is not None:
            shown = {k: v for k, v in dict(params or {}).items() if k not in ("session_token",)}
            self.tell(f"{self.world.now:9.3f} server pid {session.pid} {name} {shown} -> {answer}")

    def _named(
        self, name: str, session: ServerSession, params: dict[str, Any]
    ) -> tuple[list[Any], bool]:
        if name in ("probe_version",):
            return [("PostgreSQL 15 (simulated)",)], True
        if name in ("probe_try_lock", "probe_unlock"):
            key = (int(params["k1"]) << 32) | (int(params["k2"]) & 0xFFFFFFFF)
            if name == "probe_try_lock":
                return [(self._probe_locks.try_lock(session, key),)], True
            return [(self._probe_locks.unlock(session, key),)], True
        try:
            rows = self.ledger.execute(name, session, params)
        except StatementError as exc:
            raise psycopg.errors.lookup(exc.sqlstate)(str(exc)) from None
        return rows, name not in _NO_ROWS

    def _plumbing(self, session: ServerSession, text: str, params: Any) -> tuple[list[Any], bool]:
        if _SET_UP.match(text):
            token, names, values = params
            session.settings["replicron.session_token"] = token
            session.settings.update(zip(names, values, strict=True))
            return [(session.pid, token, list(values))], True
        if text == _WHO:
            return [(session.pid, session.settings.get("replicron.session_token"))], True
        if text == "SELECT pg_backend_pid()":
            return [(session.pid,)], True
        if text == "SELECT pg_advisory_unlock_all()":
            self.ledger.db.locks.session_ended(session)
            return [(None,)], True
        if text == BOUND_STATEMENT:
            return [(params["timeout"], params["timeout"])], True
        if text == "SELECT version FROM replicron_migrations":
            return list(self._versions), True
        if text.startswith("SELECT pg_advisory_xact_lock("):
            return [(None,)], True
        if text in ("BEGIN", "COMMIT", "ROLLBACK") or text.startswith(("SET ", "CREATE TABLE IF")):
            return [], False
        raise AssertionError(f"the simulated server does not know this statement: {text[:200]}")


class _Info:
    def __init__(self, pid: int) -> None:
        self.backend_pid = pid
        self.server_version = 150000
        self.transaction_status = psycopg.pq.TransactionStatus.IDLE


class _Cursor:
    def __init__(self, rows: list[Any], described: bool) -> None:
        self._rows = rows
        self.description = [None] if described else None

    async def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    async def fetchall(self) -> list[Any]:
        return list(self._rows)


class _NoOp:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


class SimConnection:
    """What replicron uses of ``psycopg.AsyncConnection``, over a simulated link."""

    def __init__(self, server: Server, link: Link, session: ServerSession) -> None:
        self._server = server
        self._link = link
        self._session = session
        self.info = _Info(session.pid)
        self.closed = False
        self.broken = False
        self.autocommit = True

    @classmethod
    async def open(cls, server: Server, link: Link) -> SimConnection:
        """Connect: a round trip that opens a server session (none if either way is lost)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[ServerSession] = loop.create_future()
        world = link.world
        if link.lost():
            await asyncio.Event().wait()  # never answered: the caller's timeout ends the wait

        def arrive() -> None:
            session = server.open()
            if link.lost():
                world.call_later(10.0, lambda: server.end(session))  # a half-open connection
                return
            world.call_at(link.arrival(), lambda: _settle(answer, lambda: session))

        world.call_at(link.arrival(), arrive)
        return cls(server, link, await answer)

    async def execute(
        self, query: str | bytes, params: Any = None, *, prepare: bool | None = None
    ) -> _Cursor:
        if self.closed:
            raise psycopg.OperationalError("the connection is closed")
        text = query.decode() if isinstance(query, bytes) else str(query)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[list[Any], bool]] = loop.create_future()
        link, world, session = self._link, self._link.world, self._session
        if not link.lost():

            def answered(result: Any, failure: BaseException | None) -> None:
                if link.lost():
                    return
                world.call_at(
                    link.arrival(), lambda: _settle(answer, lambda: _raise_or(result, failure))
                )

            world.call_at(
                link.arrival(), lambda: self._server.arrive(session, text, params, answered)
            )
        try:
            rows, described = await answer
        except asyncio.CancelledError:
            self._gone()  # psycopg closes a connection whose statement was cancelled
            raise
        except psycopg.OperationalError:
            self._gone()
            raise
        return _Cursor(rows, described)

    def _gone(self) -> None:
        if not self.closed:
            self.closed = self.broken = True
            session = self._session
            self._server.gave_up(session)
            self._link.world.call_at(self._link.arrival(), lambda: self._server.end(session))

    async def close(self) -> None:
        self._gone()
        self.broken = False

    def pipeline(self) -> _NoOp:
        return _NoOp()

    def transaction(self) -> _NoOp:
        return _NoOp()

    async def __aenter__(self) -> SimConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def killed(self, notice_after: float) -> None:
        """The process died: the server ends the session once it notices."""
        self.closed = self.broken = True
        session = self._session
        self._link.world.call_later(notice_after, lambda: self._server.end(session))


def _raise_or(result: Any, failure: BaseException | None) -> Any:
    if failure is not None:
        raise failure
    return result


def _settle(future: asyncio.Future[Any], make: Callable[[], Any]) -> None:
    """Answer ``future`` on its own loop (it runs when that process next steps)."""
    if future.done():
        return
    loop = future.get_loop()

    def settle() -> None:
        if future.done():
            return
        try:
            future.set_result(make())
        except BaseException as exc:
            future.set_exception(exc)

    loop.call_soon(settle)
