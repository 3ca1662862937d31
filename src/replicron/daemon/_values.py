"""The small languages inside a daemon config: durations ("90s", "1h30m"), ``${VAR}``
expansion from the environment, instants, and the ``host:port`` to serve HTTP on."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta

__all__ = [
    "ValueProblem",
    "expand",
    "parse_command",
    "parse_duration",
    "parse_http",
    "parse_instant",
]


class ValueProblem(ValueError):
    """One value that cannot be used; its message completes "<where>: ..."."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object, *, allow_zero: bool = False) -> timedelta:
    """``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"500ms"``, ``"1h30m"``, or a number of
    seconds."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueProblem(f'must be a duration such as "90s", "10m" or "2h", not {value!r}')
    if isinstance(value, str) and _SECONDS.fullmatch(value.strip()):
        value = float(value)  # "30" from an environment variable: seconds, as 30 in TOML
    if isinstance(value, str):
        text = value.strip()
        body = text.removeprefix("-")
        position, seconds = 0, 0.0
        for part in _DURATION_PART.finditer(body):
            if part.start() != position:
                break
            seconds += float(part.group(1)) * _UNITS[part.group(2)]
            position = part.end()
        if not body or position != len(body):
            raise ValueProblem(
                f"{value!r} is not a duration: write a number and a unit (ms, s, m, h, d), "
                'such as "90s", "10m" or "1h30m"'
            )
        if body != text:
            seconds = -seconds
    else:
        seconds = float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueProblem(f"must be a finite duration, not {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueProblem(
            f"must be {'at least 0' if allow_zero else 'longer than 0'}, not {value!r}"
        )
    if seconds > 10 * 365 * 86400:
        raise ValueProblem(f"{value!r} is longer than ten years")
    return timedelta(seconds=seconds)


_REFERENCE = re.compile(r"\$(?:\{([^}]*)(\}?)|\$)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand(text: str, environ: Mapping[str, str]) -> str:
    """Replace ``${VAR}`` (and ``${VAR:-default}``) with the environment's value; ``$$`` is a
    literal ``$``. An unset variable without a default is a problem, never an empty string:
    a command run with an argument silently missing is worse than one that does not start."""

    def replace(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner is None:
            return "$"
        if not match.group(2):
            raise ValueProblem(f"${{{inner} has no closing brace (write ${{NAME}})")
        name, sep, default = inner.partition(":-")
        if not _NAME.fullmatch(name):
            raise ValueProblem(f"${{{inner}}} is not a variable reference (write ${{NAME}})")
        if name in environ and (environ[name] or not sep):
            return environ[name]
        if sep:
            return default
        raise ValueProblem(
            f"${{{name}}} is not set in the environment (or write ${{{name}:-default}})"
        )

    return _REFERENCE.sub(replace, text)


def parse_instant(value: object) -> datetime:
    """A TOML offset date-time, or the same as an ISO-8601 string, with its offset."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueProblem(f"{value!r} is not an ISO-8601 date-time") from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueProblem(
                f"{value.isoformat()} has no UTC offset: write it as {value.isoformat()}Z or "
                f"with its offset, such as {value.isoformat()}+02:00"
            )
        return value
    if isinstance(value, date | time):
        raise ValueProblem(f"{value.isoformat()} must be a date and a time with a UTC offset")
    raise ValueProblem(f"must be a date-time with a UTC offset, not {value!r}")


def parse_http(value: object) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"``, ``":9464"`` or ``"9464"`` (localhost)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueProblem(f'must be "host:port", such as "127.0.0.1:9464", not {value!r}')
    host, sep, port = value.strip().rpartition(":")
    if not sep:
        host, port = "", value.strip()
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueProblem(f'{value!r} needs a port from 1 to 65535, such as "127.0.0.1:9464"')
    return host, int(port)


def parse_command(value: object, shell: bool) -> tuple[str, ...]:
    """A command job's ``command``: a list of arguments, or with ``shell`` one script."""
    if shell:
        if not isinstance(value, str) or not value.strip():
            raise ValueProblem("with shell = true, must be one string of shell script")
        if "\0" in value:
            raise ValueProblem("the script holds a NUL character")
        return (value,)
    if isinstance(value, str):
        raise ValueProblem(
            f"must be a list of arguments such as {value.split()!r} (no shell parses it), "
            "or set shell = true to have /bin/sh run the string"
        )
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise ValueProblem(f"must be a non-empty list of strings, not {value!r}")
    if not value[0]:
        raise ValueProblem("its first item, the program, is empty")
    if any("\0" in item for item in value):
        raise ValueProblem("an argument holds a NUL character, which no program can receive")
    return tuple(value)
