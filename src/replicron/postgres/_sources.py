"""Where the PostgreSQL backend gets its connection settings: a DSN, a psycopg pool, or an
SQLAlchemy engine or URL. Whatever the source, the backend's lock session is one dedicated
connection of its own, made with the same settings, outside any pool."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, Protocol, runtime_checkable

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from replicron.dsn import plain_postgres_url
from replicron.errors import ConfigurationError

from ._secrets import masked, masking_errors

__all__ = ["ConnectionSource", "PsycopgPool", "SqlAlchemyEngine", "SqlAlchemyURL", "conninfo_of"]


# What a psycopg pool holds: a value, or a function that gives it (async ones too).
_Conninfo = str | Callable[[], str] | Callable[[], Awaitable[str]]
_Kwargs = (
    dict[str, Any] | Callable[[], dict[str, Any]] | Callable[[], Awaitable[dict[str, Any]]] | None
)


@runtime_checkable
class PsycopgPool(Protocol):
    """A psycopg_pool ``ConnectionPool``/``AsyncConnectionPool``: its conninfo and kwargs."""

    @property
    def conninfo(self) -> _Conninfo: ...

    @property
    def kwargs(self) -> _Kwargs: ...


@runtime_checkable
class SqlAlchemyURL(Protocol):
    def render_as_string(self, hide_password: bool = ...) -> str: ...


@runtime_checkable
class SqlAlchemyEngine(Protocol):
    """An SQLAlchemy ``Engine`` or ``AsyncEngine`` (its URL is read, nothing else)."""

    @property
    def url(self) -> SqlAlchemyURL: ...


#: What ``PostgresBackend`` and ``migrate`` take.
ConnectionSource = str | PsycopgPool | SqlAlchemyEngine | SqlAlchemyURL


def _value(given: Any, what: str) -> Any:
    """A pool's setting now: called if it is a function; an async one cannot be awaited in a
    constructor, so it is refused with what to do instead."""
    value = given() if callable(given) else given
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise ConfigurationError(
            f"the pool's {what} is an async function: give PostgresBackend a DSN instead"
        )
    return value


@cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def conninfo_of(source: object) -> str:
    """The libpq conninfo string of ``source``: a DSN (libpq URL, key=value string or
    SQLAlchemy URL string), a psycopg pool (its conninfo *and* the connection parameters
    among its kwargs), or an SQLAlchemy engine or URL object. One that libpq cannot parse is
    refused here, with its password masked, rather than when the backend first connects."""
    conninfo = _conninfo_of(source)
    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"not a valid PostgreSQL connection string: {masked(str(exc).strip(), conninfo)}"
        ) from None
    return conninfo


def _conninfo_of(source: object) -> str:
    if isinstance(source, str):
        return plain_postgres_url(source)
    if isinstance(source, SqlAlchemyEngine) and isinstance(source.url, SqlAlchemyURL):
        source = source.url
    if isinstance(source, SqlAlchemyURL):
        return plain_postgres_url(source.render_as_string(hide_password=False))
    if isinstance(source, PsycopgPool):
        # The pool's kwargs hold libpq parameters (dbname=..., host=...) beside connection
        # options (autocommit, row_factory ...) that mean nothing to a conninfo.
        keywords = _libpq_keywords()
        kwargs: dict[str, Any] = _value(source.kwargs, "kwargs") or {}
        params = {k: v for k, v in kwargs.items() if k in keywords}
        conninfo: str = plain_postgres_url(_value(source.conninfo, "conninfo"))
        with masking_errors(conninfo):
            return make_conninfo(conninfo, **params)
    raise ConfigurationError(
        "PostgresBackend takes a DSN, a psycopg pool, or an SQLAlchemy engine or URL, "
        f"not {type(source).__name__}"
    )
