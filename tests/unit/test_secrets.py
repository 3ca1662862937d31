"""Errors of every entry point that takes a connection string never show its password: the
string cannot be parsed (libpq quotes it, or the password alone), or the server cannot be
reached. No server is needed: port 1 of this host refuses."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable

import psycopg
import pytest

from replicron import Scheduler
from replicron.cli import main as cli
from replicron.postgres import PostgresBackend, alocked_run, locked_run, migrate
from replicron.postgres._secrets import masked, scrub

#: Every password below holds "s3cr"; none may be seen.
SECRET = "s3cr"

UNPARSEABLE = [
    "postgresql://app:s3cr#t@[::1/db",  # libpq quotes the whole URL
    "postgresql://app:s3cr%zzet@127.0.0.1/db",  # libpq quotes the password alone
    "postgresql+psycopg://app:s3cr%zzet@127.0.0.1/db",
]
REFUSED = [
    "postgresql://app:s3cr@t@127.0.0.1:1/db",
    "postgresql+psycopg://app:s3cr%40t@127.0.0.1:1/db?connect_timeout=2",
    "host=127.0.0.1 port=1 user=app password='s3cr et' connect_timeout=2",
    # A raw "@" with the secret after it (a parser splitting at the first "@" takes it for
    # the host), and an unquoted password with a space (libpq then quotes a word of it).
    "postgresql://app:pw@s3cret@127.0.0.1:1/db",
    "postgresql+psycopg://app:p@ss@s3cret@127.0.0.1:1/db?connect_timeout=2",
    "host=127.0.0.1 port=1 user=app password=correct s3cret-staple connect_timeout=2",
]


def _noop() -> None:
    pass


async def _anoop() -> None:
    pass


def _start_a_scheduler(dsn: str) -> None:
    scheduler = Scheduler(backend=PostgresBackend(dsn, connect_timeout=2))
    try:
        scheduler.start()
    finally:
        scheduler.shutdown(wait=False)


ENTRY_POINTS: dict[str, Callable[[str], object]] = {
    "PostgresBackend": lambda dsn: PostgresBackend(dsn),
    "migrate": lambda dsn: asyncio.run(migrate(dsn)),
    "locked_run": lambda dsn: locked_run(dsn, "job", _noop),
    "alocked_run": lambda dsn: asyncio.run(alocked_run(dsn, "job", _anoop)),
    "Scheduler.start": _start_a_scheduler,
}


def _failure(call: Callable[[str], object], dsn: str) -> str:
    """Everything a caller could print of the error ``call(dsn)`` raises."""
    with pytest.raises(Exception) as caught:
        call(dsn)
    exc = caught.value
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.args)


@pytest.mark.parametrize(
    ("entry", "dsn"),
    # A valid string is refused only when connecting: the constructor has nothing to say.
    [(entry, dsn) for entry in ENTRY_POINTS for dsn in UNPARSEABLE]
    + [(entry, dsn) for entry in ENTRY_POINTS if entry != "PostgresBackend" for dsn in REFUSED],
)
def test_errors_never_show_the_password(entry: str, dsn: str) -> None:
    text = _failure(ENTRY_POINTS[entry], dsn)
    assert SECRET not in text
    assert "***" in text or "127.0.0.1" in text  # the error still says what went wrong


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("postgresql://app:pw@s3cret@h/db", "pw@s3cret"),
        ("postgresql+psycopg://app:a@b#c@d@h:5432/db?sslmode=disable", "a@b#c@d"),
        ("postgresql://app:p%40ss@h/db", "p@ss"),
        ("postgresql://app@h/db", None),
    ],
)
def test_a_raw_at_sign_in_a_url_password_is_part_of_the_password(
    url: str, password: str | None
) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from replicron.postgres._sources import conninfo_of

    params = conninfo_to_dict(conninfo_of(url))
    assert (params["user"], params.get("password"), params["host"]) == ("app", password, "h")


def test_a_connection_string_libpq_cannot_parse_is_refused_at_construction() -> None:
    from replicron import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"invalid percent-encoded token: \"\*\*\*\""):
        PostgresBackend(UNPARSEABLE[1])


@pytest.mark.parametrize("dsn", UNPARSEABLE + REFUSED)
@pytest.mark.parametrize("command", ["status", "migrate"])
def test_the_cli_never_shows_the_password(
    command: str, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli([command, "--database-url", dsn]) != 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "***" in err or "127.0.0.1" in err


@pytest.mark.parametrize(
    ("conninfo", "message", "expected"),
    [
        # By value: wherever and however the password appears.
        (
            "postgresql://u:ab%zz@h/db",
            'invalid percent-encoded token: "ab%zz"',
            'invalid percent-encoded token: "***"',
        ),
        ("postgresql://u:p%40ss@h/db", "saw p@ss and p%40ss", "saw *** and ***"),
        ("host=h password='two words'", "got 'two words'", "got '***'"),
        (
            "postgresql://u:ab#cd@h/db",
            "in URI: postgresql://u:ab#cd@h/db",
            "in URI: postgresql://u:***@h/db",
        ),
        # By shape, whoever's password it is.
        ("host=h", "at postgresql://x:other@h/db", "at postgresql://x:***@h/db"),
        ("host=h", "password=other sslmode=require", "password=*** sslmode=require"),
        # Nothing to mask.
        ("postgresql://u@h/db", "connection refused", "connection refused"),
    ],
)
def test_masked(conninfo: str, message: str, expected: str) -> None:
    assert masked(message, conninfo) == expected


def test_scrub_masks_the_whole_chain_in_place() -> None:
    conninfo = "postgresql://u:s3cr3t@h/db"
    cause = OSError(111, "refused by s3cr3t")
    try:
        try:
            raise cause
        except OSError as exc:
            raise psycopg.OperationalError(f"cannot connect to {conninfo}") from exc
    except psycopg.OperationalError as exc:
        error = exc
    scrub(error, conninfo)
    assert type(error) is psycopg.OperationalError
    assert error.__cause__ is cause
    assert str(error) == "cannot connect to postgresql://u:***@h/db"
    assert cause.args == (111, "refused by ***")
