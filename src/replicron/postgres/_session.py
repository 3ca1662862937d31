"""The lock session: one dedicated PostgreSQL connection per replica.

Every advisory lock of the replica lives on this connection, and every statement of the
backend goes through it, one at a time. It is opened directly (never from a transaction
pooler, whose statements may land on different server sessions: refused at connect by a probe
and afterwards by the server session each locking statement reports), in autocommit mode,
without prepared statements, with TCP keepalives and a bound on unacknowledged data on both
ends, so that a cut-off replica's session (and its locks) is dropped by the server within a
bound. Every statement has a client-side deadline: a hung server, proxy or network can hold a
statement only that long. A session whose state is unknown after an error or a missed deadline
is closed and never reused: its locks are gone with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus

from replicron.errors import ReplicronError

from ._bounds import _rows, keepalive_params, server_settings
from ._secrets import scrub
from ._setting_names import PYTHON_NAMES, SettingNames

__all__ = [
    "BackendUnavailableError",
    "LockSession",
    "RoundTrip",
    "TransactionPoolerError",
    "connect_failure",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")
Runner = Callable[[str, Mapping[str, Any]], Awaitable[list[tuple[Any, ...]]]]

#: Set in the task of each statement the session runs (see :meth:`LockSession._within`).
_OURS: contextvars.ContextVar[bool] = contextvars.ContextVar("replicron_statement", default=False)
#: What psycopg warns when a query's cancellation is cut short or not answered: the
#: connection is closed. For a statement replicron gave up on, that is its own doing, said
#: once by its error and the backend's health.
_CANCELLATION_CUT_SHORT = ("query cancellation interrupted", "query not terminated after")


class _GivenUpStatements(logging.Filter):
    """Drops psycopg's warnings about the cancellation of a statement replicron gave up on;
    those of the application's own statements pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_OURS.get() and record.getMessage().startswith(_CANCELLATION_CUT_SHORT))


logging.getLogger("psycopg").addFilter(_GivenUpStatements())


#: Probe rounds when something pools between the replica and PostgreSQL, and statements of
#: the probe per unpinned round (more than a pool has idle server sessions, as a rule).
POOLED_PROBE_ROUNDS = 20
PROBE_STATEMENTS = 25
#: At start-up, the pause before another try at the first session (a random part of it, so
#: that replicas started together do not all try again at once), and the least time left
#: worth another try.
START_PAUSE = 0.5
START_LEAST_TRY = 0.5
#: The failures at start-up that are the want of an answer (the client's deadline, or the
#: server's statement or lock timeout), or a server's "not now" (one still starting, or with
#: all its connection slots taken by a herd, or that ended the session: an administrator's
#: pg_terminate_backend, a restart): worth another try. Any other (a wrong database, role or
#: password, pg_hba, a malformed URL) would fail again alike. A refused connection carries no
#: SQLSTATE, so that kind is told by its message.
NO_ANSWER = (
    TimeoutError,
    psycopg.errors.QueryCanceled,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.AdminShutdown,
)
NOT_NOW = (
    "no answer within",
    "timeout expired",
    "Connection refused",
    "closed the connection",
    "could not receive data",
    "could not send data",
    "starting up",
    "shutting down",
    "not yet accepting",
    "too many",
    "connection slots",
)


def worth_another_try(exc: BaseException) -> bool:
    """Whether a failure at start-up may go another way if tried again: the want of an
    answer, or a server's "not now"."""
    text = f"{exc} {exc.__cause__ or ''}"
    return isinstance(exc.__cause__, NO_ANSWER) or any(why in text for why in NOT_NOW)


class BackendUnavailableError(ReplicronError, ConnectionError):
    """The database could not be reached or the lock session was lost."""


class TransactionPoolerError(ReplicronError, RuntimeError):
    """The lock session is behind a transaction pooler: advisory locks would not hold."""


class _CannotConnect(BackendUnavailableError):
    """No session could be opened: retrying at once would only wait as long again."""


class _RolledBack(BackendUnavailableError):
    """The server rolled the statement back (a deadlock with another replica's claim): the
    session is fine and the statement may run again."""


def connect_failure(
    what: str, exc: BaseException, timeout: float, bound: str = "connect_timeout"
) -> str:
    """``what`` failed, and why: the error's text, or what its type means where it has none
    (the connection's own deadline raises a bare ``TimeoutError``: ``timeout`` seconds, the
    setting or deadline named ``bound``)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        reason = f"no answer within {timeout:g} s ({bound})"
    else:
        reason = str(exc) or type(exc).__name__
    return f"{what}: {reason}"


class RoundTrip(NamedTuple):
    """When the last statement was sent and its answer received: wall clock (Unix seconds)
    and monotonic clock (``time.monotonic``, which the event loop's timers use too)."""

    sent_wall: float
    received_wall: float
    sent_mono: float
    received_mono: float


class LockSession:
    def __init__(
        self,
        conninfo: str,
        *,
        application_name: str,
        connect_timeout: float,
        statement_deadline: float,
        drop_after: float,
        on_lost: Callable[[], None],
        session_pooler: bool = False,
        setting_names: SettingNames = PYTHON_NAMES,
        reconnect_deadline: float | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.application_name = application_name
        self.connect_timeout = connect_timeout
        self.statement_deadline = statement_deadline
        #: How long a new session may take in all, once one was lost (the backend's
        #: statements, its heartbeats among them, wait behind it); ``connect_timeout`` if None.
        self.reconnect_deadline = (
            connect_timeout if reconnect_deadline is None else reconnect_deadline
        )
        self.drop_after = drop_after
        self.session_pooler = session_pooler
        #: How the user spells the settings a pooler refusal names.
        self.setting_names = setting_names
        self._on_lost = on_lost
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._serial = asyncio.Lock()
        self._invalid = False
        self._orphans: set[asyncio.Future[Any]] = set()  # statements given up on
        self.backend_pid: int | None = None
        self._token = ""  # a setting of the server session: statements check they run there
        self._direct = True  # no pooler in between (the cancel key names the real session)
        self.generation = 0  # bumped on every (re)connect: locks belong to one generation
        self.last_round_trip: RoundTrip | None = None
        self.connect_failed_at: float | None = None  # monotonic; None once one succeeds
        #: While the first session is being opened: when (monotonic) start-up gives up.
        self._start_until = math.inf
        #: The start deadline (monotonic), from the first :meth:`connect` on; None before.
        self.start_deadline: float | None = None
        #: Run on every new connection before anything else, with a way to run statements on
        #: it (the backend checks which server it reached: see ``_failover``).
        self.on_connect: Callable[[Runner], Awaitable[None]] | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed and not self._invalid

    async def connect(self) -> None:
        """Open the session. The first one (start-up) has ``connect_timeout`` in all, its
        start deadline, for connecting, its settings and the check of which server it
        reached (the pooler probe's statements have a statement deadline each). A try that
        fails for want of an answer (a server slowed by a hundred replicas starting at once,
        one still starting, one refusing connections for a moment) is made again after a
        short pause while enough of that deadline is left; past it, the last try's failure
        is raised. A refusal (a transaction pooler) is never tried again. The rest of
        start-up may be tried again by the same deadline (:meth:`starting`)."""
        async with self._serial:
            if self.generation > 0:
                await self._connect_locked()
                return
            self.start_deadline = self._start_until = time.monotonic() + self.connect_timeout
            try:
                await self._until_started(self._connect_locked)
            finally:
                self._start_until = math.inf

    async def starting(self, step: Callable[[], Awaitable[T]]) -> T:
        """A step of start-up once the session is open (migrating, the first clock samples
        and heartbeat): as the session's opening, tried again after a short pause when it
        fails for want of an answer, while the start deadline that :meth:`connect` set
        leaves enough time."""
        return await self._until_started(step)

    async def _until_started(self, step: Callable[[], Awaitable[T]]) -> T:
        until = self.start_deadline
        while True:
            try:
                return await step()
            except BackendUnavailableError as exc:
                pause = random.uniform(0.0, START_PAUSE)
                left = -math.inf if until is None else until - time.monotonic() - pause
                if left < START_LEAST_TRY or not worth_another_try(exc):
                    raise
                logger.info("starting: %s; trying again (%.1f s left)", exc, left)
                await asyncio.sleep(pause)

    async def _connect_locked(self) -> None:
        if self._invalid:
            await self._drop()
        if self.connected:
            return
        until = self._connect_until()
        conn = await self._open_connection("cannot connect to PostgreSQL", until)
        try:
            token = uuid.uuid4().hex
            pid = await self._set_up(conn, token, until)
            await self._refuse_a_pooler(conn, pid, token, with_probe=self.generation == 0)
        except BaseException:
            await _close_quietly(conn)
            raise
        await self._connected_to(conn, until)
        self._conn, self.backend_pid, self._invalid = conn, pid, False
        self._token = token
        self.generation += 1

    def _connect_until(self) -> float:
        """When (monotonic) a connection being made must be ready. The first one, by the start
        deadline (see :meth:`connect`), with a statement deadline per statement as well; a new
        one, once one was lost, has ``reconnect_deadline`` for everything, since the
        statements of the backend (its heartbeats too) wait behind it."""
        if self.generation == 0:
            return self._start_until
        return time.monotonic() + self.reconnect_deadline

    def _deadline(self, until: float) -> float:
        """A statement's deadline while a connection is made that must be ready by ``until``."""
        return max(0.0, min(self.statement_deadline, until - time.monotonic()))

    async def _connected_to(self, conn: psycopg.AsyncConnection[Any], until: float) -> None:
        """Run ``on_connect`` on a new connection (closed if that fails)."""
        if self.on_connect is None:
            return
        try:
            await self.on_connect(
                lambda query, params: self._within(
                    self._statement(conn, query, params), self._deadline(until)
                )
            )
        except (psycopg.Error, TimeoutError) as exc:
            await _close_quietly(conn)
            raise BackendUnavailableError(f"cannot check the server: {exc}") from exc
        except BaseException:
            await _close_quietly(conn)
            raise

    async def _open_connection(
        self, what: str, until: float = math.inf
    ) -> psycopg.AsyncConnection[Any]:
        timeout = max(0.0, min(self.connect_timeout, until - time.monotonic()))
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self.conninfo,
                    autocommit=True,
                    prepare_threshold=None,  # a pooler would mix prepared statements up
                    application_name=self.application_name,
                    connect_timeout=max(1, math.ceil(timeout)),
                    **keepalive_params(self.drop_after),
                ),
                timeout,
            )
        except (psycopg.Error, TimeoutError, OSError) as exc:
            self.connect_failed_at = time.monotonic()
            scrub(exc, self.conninfo)  # libpq may quote the connection string
            raise _CannotConnect(connect_failure(what, exc, *self._connect_bound())) from exc
        self.connect_failed_at = None
        return conn

    def _connect_bound(self) -> tuple[float, str]:
        """The deadline a connection being made had, and its name: the first one, the
        connect timeout; a new one once one was lost, the reconnect deadline where shorter."""
        if self.generation == 0 or self.connect_timeout <= self.reconnect_deadline:
            return self.connect_timeout, "connect_timeout"
        return self.reconnect_deadline, "reconnect deadline"

    async def _set_up(self, conn: psycopg.AsyncConnection[Any], token: str, until: float) -> int:
        """Make the server session's settings and mark it with ``token``, in one round trip;
        its server pid."""
        names, values = zip(
            *server_settings(
                self.drop_after, self.statement_deadline, conn.info.server_version
            ).items(),
            strict=True,
        )
        try:
            cursor = await self._within(
                conn.execute(
                    "SELECT pg_backend_pid(), set_config('replicron.session_token', %s, false),"
                    " ARRAY(SELECT set_config(name, value, false)"
                    "       FROM unnest(%s::text[], %s::text[]) AS setting(name, value))",
                    [token, list(names), list(values)],
                ),
                self._deadline(until),
            )
            row = await cursor.fetchone()
        except (psycopg.Error, TimeoutError) as exc:
            raise BackendUnavailableError(f"cannot set up the lock session: {exc}") from exc
        assert row is not None
        return int(row[0])

    async def _refuse_a_pooler(
        self, conn: psycopg.AsyncConnection[Any], pid: int, token: str, *, with_probe: bool
    ) -> None:
        """Refuse a transaction pooler, which may run each statement on another server session.

        Something that pools connections shows itself at once: the server session id it
        announces when the connection opens (the cancel key) is its own, not the real one.
        Which mode it pools in cannot be seen for certain, so a pooler is refused unless the
        backend was told it runs in session mode (``session_pooler=True``); then, and for a
        direct connection, a short-lived probe connection (``with_probe``: at start-up only,
        so that a new session after a lost one needs one free connection slot, not two) asks
        for its server session in rounds of two kinds: while the lock session is idle (two
        client connections never share a server session; a transaction pooler hands the idle
        one to whoever asks next), and from inside a transaction of its own, after which the
        lock session must still be on its server session with the setting it made there. The
        server session id each locking statement reports is checked on every session.
        """
        pooled = conn.info.backend_pid != pid
        self._direct = not pooled
        if pooled and not self.session_pooler:
            raise TransactionPoolerError(
                f"the connection goes through a connection pooler (it announced server session "
                f"{conn.info.backend_pid}, the real one is {pid}). In transaction mode session "
                "advisory locks do not hold, and the mode cannot be told for certain from here. "
                f"{self.setting_names.behind_a_pooler()}; or, if the pooler runs in session "
                f"mode, say so: {self.setting_names.session_pooler}."
            )
        if not with_probe:
            return
        probe = await self._open_connection("cannot open the pooler probe")
        try:
            for round_ in range(POOLED_PROBE_ROUNDS if pooled else 1):
                if await self._moves(conn, probe, pid, token, pinned=round_ % 2 == 1):
                    raise TransactionPoolerError(
                        f"the lock session's statements do not stay on server session {pid}: "
                        "the connection goes through a transaction pooler, where session "
                        "advisory locks do not hold. "
                        f"{self.setting_names.behind_a_pooler()}, or through a pooler in "
                        "session mode."
                    )
        except (psycopg.Error, TimeoutError) as exc:
            raise BackendUnavailableError(f"cannot probe the lock session: {exc}") from exc
        finally:
            await _close_quietly(probe)

    async def _moves(
        self,
        conn: psycopg.AsyncConnection[Any],
        probe: psycopg.AsyncConnection[Any],
        pid: int,
        token: str,
        *,
        pinned: bool,
    ) -> bool:
        """One round of the probe: True when a pooler showed itself. Unpinned, the probe asks
        several times: a pooler handing out its idle server sessions in turn (round robin)
        comes to the lock session's within as many statements as it has idle ones."""
        ours = "SELECT pg_backend_pid(), current_setting('replicron.session_token', true)"
        if pinned:
            await self._timed(probe.execute("BEGIN"))
        probe_pids = []
        for _ in range(1 if pinned or self._direct else PROBE_STATEMENTS):
            cursor = await self._timed(probe.execute("SELECT pg_backend_pid()"))
            probe_row = await cursor.fetchone()
            assert probe_row is not None
            probe_pids.append(probe_row[0])
        rows = [await (await self._timed(conn.execute(ours))).fetchone()]
        if pinned:
            await self._timed(probe.execute("COMMIT"))
            rows.append(await (await self._timed(conn.execute(ours))).fetchone())
        return pid in probe_pids or any(row != (pid, token) for row in rows)

    async def _timed(self, awaitable: Awaitable[T]) -> T:
        return await self._within(awaitable, self.statement_deadline)

    async def _within(self, awaitable: Awaitable[T], deadline: float) -> T:
        """Await a statement for at most ``deadline`` seconds (TimeoutError past it). A
        statement given up on, or whose caller is cancelled, is abandoned at once: its
        connection's state is unknown from then on."""
        marked = _OURS.set(True)
        try:
            statement = asyncio.ensure_future(awaitable)  # its task keeps the mark
        finally:
            _OURS.reset(marked)
        try:
            done, _ = await asyncio.wait({statement}, timeout=deadline)
        except asyncio.CancelledError:
            await self._abandon(statement)
            raise
        if not done:
            await self._abandon(statement)
            raise TimeoutError(f"no answer within {round(deadline, 2):g} s")
        return statement.result()

    async def fetch(
        self, query: str, params: Mapping[str, Any], *, retry: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run one statement on the session and return its rows.

        Connects first if needed. When the connection fails or the statement misses its
        deadline, the session is closed for good (its locks died with it) and ``on_lost`` is
        called; with ``retry`` (idempotent statements only) it is run once more on a fresh
        session, else :class:`BackendUnavailableError` is raised.
        """
        try:
            return await self._fetch_once(query, params)
        except BackendUnavailableError as exc:
            if not retry or isinstance(exc, _CannotConnect):
                raise
            if not isinstance(exc, _RolledBack):
                logger.debug("lost the lock session; retrying once on a new one")
            return await self._fetch_once(query, params)

    async def _fetch_once(self, query: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        async with self._connected() as conn:
            # Locking statements check that they run on this server session (a pooler would
            # move them): the session they are for is the one they are sent on.
            params = {**params, "pid": self.backend_pid, "session_token": self._token}
            sent_wall, sent_mono = self._sending()
            try:
                rows = await self._timed(self._statement(conn, query, params))
            except psycopg.errors.TransactionRollback as exc:
                raise _RolledBack(f"the server rolled the statement back: {exc}") from exc
            except psycopg.OperationalError as exc:
                await self._drop()
                raise BackendUnavailableError(f"lost the lock session: {exc}") from exc
            self.last_round_trip = RoundTrip(sent_wall, time.time(), sent_mono, time.monotonic())
            return rows

    def _statement(
        self, conn: psycopg.AsyncConnection[Any], query: str, params: Mapping[str, Any]
    ) -> Awaitable[list[tuple[Any, ...]]]:
        """One statement on the session. Its server session carries the server's bounds (set
        as it opened): a statement given up on here ends there as well."""
        return _rows(conn, query, params)

    def _sending(self) -> tuple[float, float]:
        """When (wall, monotonic) the statement about to be sent counts as sent: no later than
        the server's ``now()`` for it, which the leases it writes count from."""
        return time.time(), time.monotonic()

    async def run(
        self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], *, deadline: float
    ) -> T:
        """Run ``work`` on the session's connection, with no other statement of the session
        in between (``work`` may open a transaction; it must end it). Connects first if
        needed. As in :meth:`fetch`, a failed connection or a missed ``deadline`` closes the
        session for good and raises :class:`BackendUnavailableError`; an error the server
        answered with, leaving the session as it was, is raised as it is."""
        async with self._connected() as conn:
            try:
                return await self._within(work(conn), deadline)
            except psycopg.Error as exc:
                if conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
                    await self._drop()
                    raise BackendUnavailableError(f"lost the lock session: {exc}") from exc
                raise  # refused by the server (a lock timeout ...): the session is as it was

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The session's connection (connected first if need be), for one statement or piece
        of work at a time. Cut short (cancelled, or past its deadline), it leaves the session
        in an unknown state: the session is dropped."""
        async with self._serial:
            await self._connect_locked()
            conn = self._conn
            assert conn is not None
            try:
                yield conn
            except asyncio.CancelledError:
                await self._drop()
                raise
            except TimeoutError as exc:
                await self._drop()
                raise BackendUnavailableError(f"the lock session gave {exc}") from exc

    async def _abandon(self, statement: asyncio.Future[Any]) -> None:
        """Stop waiting for a statement whose answer did not come. psycopg answers a first
        cancellation by asking the server to cancel the query (which may hang as well) and a
        second one by closing the connection."""
        statement.cancel()
        await asyncio.sleep(0)
        statement.cancel()
        await asyncio.wait({statement}, timeout=1.0)
        if not statement.done():
            self._orphans.add(statement)
            statement.add_done_callback(self._orphans.discard)
        statement.add_done_callback(_consume)

    def invalidate(self) -> None:
        """Give the session up as soon as no statement is using it (the lease ran out): a
        session whose runs were told to stop must not keep their locks."""
        self._invalid = True
        if not self._serial.locked():
            conn, self._conn = self._conn, None
            if conn is not None:
                closing = asyncio.ensure_future(_close_quietly(conn))
                self._orphans.add(closing)
                closing.add_done_callback(self._orphans.discard)
                self._on_lost()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._invalid = False
        if conn is not None:
            await _close_quietly(conn)
            self._on_lost()

    async def close(self) -> None:
        async with self._serial:
            conn, self._conn = self._conn, None
            if conn is not None and not conn.closed:
                # Unlock at once where the server answers; where it does not, closing frees
                # them too, once the server notices. Either way shutdown does not wait long.
                unlock = _rows(conn, "SELECT pg_advisory_unlock_all()", {})
                with contextlib.suppress(psycopg.Error, TimeoutError):
                    await self._within(unlock, min(1.0, self.statement_deadline))
                await _close_quietly(conn)
        for orphan in list(self._orphans):
            orphan.cancel()
        if self._orphans:
            await asyncio.wait(set(self._orphans), timeout=1.0)


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:  # the connection is broken anyway
        logger.debug("closing a broken connection failed", exc_info=True)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
