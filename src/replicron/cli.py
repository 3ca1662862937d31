"""The ``replicron`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import NoReturn

from ._tz import UTC, resolve_zone
from .errors import ReplicronError
from .triggers import cron, upcoming

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other replicron error; `--help` shows the usage.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replicron", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    nxt = commands.add_parser(
        "next",
        help="print the next fire times of a cron expression",
        description="Print the next fire times of a cron expression, one per line, "
        "as ISO-8601 instants with the offset of --tz.",
    )
    nxt.add_argument("expression", help="cron expression, e.g. '*/15 9-17 * * mon-fri'")
    nxt.add_argument("--seconds", action="store_true", help="expression has a seconds field")
    nxt.add_argument("--tz", default="UTC", help="IANA time zone (default UTC)")
    nxt.add_argument("-n", type=int, default=5, help="how many fire times (default 5)")
    nxt.add_argument("--after", help="start after this ISO-8601 time (default now)")
    return parser


def _cmd_next(args: argparse.Namespace) -> int:
    zone = resolve_zone(args.tz)
    assert zone is not None
    if args.n < 1:
        raise ValueError(f"-n must be at least 1, got {args.n}")
    trigger = cron(args.expression, seconds=args.seconds, tz=zone)
    if args.after is None:
        after = datetime.now(UTC)
    else:
        try:
            after = datetime.fromisoformat(args.after)
        except ValueError:
            raise ValueError(f"--after {args.after!r} is not an ISO-8601 date-time") from None
        if after.tzinfo is None:
            after = after.replace(tzinfo=zone)
    for instant in upcoming(trigger, after, args.n):
        print(instant.astimezone(zone).isoformat())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "next":
            return _cmd_next(args)
    except (ReplicronError, ValueError) as exc:
        print(f"replicron: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
