"""Errors that may quote a connection string never show its password.

libpq quotes the string it could not parse (``... in URI: "postgresql://u:secret@[::1/db"``),
and a message may be passed on by any layer above. Every error raised where a connection is
made goes through :func:`scrub`: passwords are masked by shape (:func:`mask_dsn`: URLs,
``password=`` pairs) and by value (the password of the connection string at hand, wherever
and however it appears).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from urllib.parse import quote, unquote

from psycopg.conninfo import conninfo_to_dict

from replicron.dsn import mask_dsn

__all__ = ["masked", "masking_errors", "scrub"]

_MASK = "***"
#: Pieces of a password (split at "@" or spaces) shorter than this are not masked on their
#: own: masking every "a" of a message would hide it, and such a piece gives little away.
_SHORTEST = 3
# password=... in a key=value string, up to the next keyword (an unquoted value with spaces).
_KEYWORD_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*(?P<value>.*?)(?=\s+\w+\s*=|$)", re.S)


def _passwords(conninfo: str) -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(Exception):  # unparseable: masking by shape still holds
        password = conninfo_to_dict(conninfo).get("password")
        if password:
            found.add(str(password))
    if "://" in conninfo:  # the URL's own spelling too (percent-escapes, as written)
        authority = conninfo.split("://", 1)[1].rsplit("@", 1)
        if len(authority) == 2 and ":" in authority[0]:
            found.add(authority[0].split(":", 1)[1])
    else:  # key=value: an unquoted password with spaces, which libpq reads word by word
        value = _KEYWORD_PASSWORD.search(conninfo)
        if value is not None and not value["value"].startswith("'"):  # quoted: parsed above
            found.add(value["value"].strip())
            found.update(word for word in value["value"].split() if len(word) >= _SHORTEST)
    spellings = {
        spelling
        for password in found
        for spelling in (password, unquote(password), quote(password, safe=""))
        if spelling
    }
    # A raw "@" in a password: a parser splitting at it quotes the pieces as host or user.
    pieces: set[str] = set()
    for spelling in spellings:
        parts = spelling.split("@")
        for cut in range(1, len(parts)):
            pieces.update(("@".join(parts[:cut]), "@".join(parts[cut:])))
    return spellings | {piece for piece in pieces if len(piece) >= _SHORTEST}


def masked(text: str, conninfo: str) -> str:
    """``text`` with every password masked: by shape, and ``conninfo``'s by value."""
    text = mask_dsn(text)
    for password in sorted(_passwords(conninfo), key=len, reverse=True):
        text = text.replace(password, _MASK)
    return text


def scrub(exc: BaseException, conninfo: str) -> None:
    """Mask the passwords in the messages of ``exc`` and of the exceptions it chains to, in
    place: the error keeps its type, its details and its traceback."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.args = tuple(
            masked(arg, conninfo) if isinstance(arg, str) else arg for arg in error.args
        )
        error = error.__cause__ or error.__context__


@contextlib.contextmanager
def masking_errors(conninfo: str) -> Iterator[None]:
    """Errors raised in the block are :func:`scrub`-bed of passwords, ``conninfo``'s too."""
    try:
        yield
    except BaseException as exc:
        scrub(exc, conninfo)
        raise
