"""Database URLs in messages: never with their password."""

from __future__ import annotations

import re

__all__ = ["mask_dsn"]

_URL_PASSWORD = re.compile(
    r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@?#]*:)(?P<secret>[^@/?#]*)(?=@)", re.I
)
_KEYWORD_PASSWORD = re.compile(
    r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I
)


def mask_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (URL and key=value forms)."""
    masked = _URL_PASSWORD.sub(r"\g<head>***", dsn)
    return _KEYWORD_PASSWORD.sub(r"\g<head>***", masked)
