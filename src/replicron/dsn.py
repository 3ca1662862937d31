"""Database URLs in messages never show their password; SQLAlchemy-style URLs are accepted."""

from __future__ import annotations

import re

__all__ = ["mask_dsn", "mask_secrets", "plain_postgres_url"]

# scheme://user:SECRET@host...: the secret runs to the authority's last "@" (a password may
# hold "#", "@" or "?" unescaped; libpq reads them so), not past the path's "/" or a space.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<secret>[^\s/]*)(?=@[^@\s/]*(?:[/?\s]|$))",
    re.I,
)
_KEYWORD_PASSWORD = re.compile(
    r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I
)
# SQLAlchemy names the driver in the scheme (postgresql+psycopg://); libpq knows none.
_DRIVER_SCHEME = re.compile(r"^(?P<scheme>postgres(?:ql)?)\+[a-z0-9_]+://", re.I)
# A PostgreSQL URL's user info up to the authority's last "@" (the host holds none): libpq
# ends it at the first "@", and would take the rest of the password for the host.
_USER_INFO = re.compile(r"^(?P<scheme>postgres(?:ql)?://)(?P<userinfo>[^/?\s]*@[^/?\s]*)@", re.I)


def mask_dsn(text: str) -> str:
    """``text`` (a DSN, or a message that may hold one) with every password replaced by
    ``***``: in URLs (any scheme, SQLAlchemy's included) and in key=value strings."""
    masked = _URL_PASSWORD.sub(r"\g<head>***", text)
    return _KEYWORD_PASSWORD.sub(r"\g<head>***", masked)


# Free text (a job's error) may carry a secret in other shapes: PGPASSWORD=..., a settings
# dict's 'password': '...', passwd=/pwd= of other drivers.
_NAMED_SECRET = re.compile(
    r"""(?P<head>(?:\b|(?<=_))(?:pg)?(?:password|passwd|pwd|passphrase)\b['"]?"""
    r"""\s*(?:=>|[=:])\s*)"""
    r"""(?P<secret>b?'(?:[^'\\]|\\.)*'|b?"(?:[^"\\]|\\.)*"|[^\s,;&}'"]+)""",
    re.I,
)


def mask_secrets(text: str) -> str:
    """:func:`mask_dsn`, and passwords named in other ways (``PGPASSWORD=...``,
    ``'password': '...'``, ``DB_PASSWORD: ...``, ``passwd=...``): for text from elsewhere,
    such as a job's error."""
    return mask_dsn(_NAMED_SECRET.sub(r"\g<head>***", text))


def plain_postgres_url(dsn: str) -> str:
    """``dsn`` as libpq reads it: a SQLAlchemy driver suffix dropped from its scheme
    (``postgresql+psycopg://`` becomes ``postgresql://``), and a raw ``@`` in a URL's user or
    password percent-encoded (``u:p@ss@host`` is user ``u``, password ``p@ss``, as SQLAlchemy
    and most URL parsers read it); anything else unchanged."""
    url = _DRIVER_SCHEME.sub(r"\g<scheme>://", dsn.strip(), count=1)
    return _USER_INFO.sub(
        lambda m: m["scheme"] + m["userinfo"].replace("@", "%40") + "@", url, count=1
    )
