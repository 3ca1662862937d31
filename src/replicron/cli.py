"""The ``replicron`` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NoReturn

from ._dsn import mask_dsn
from ._schedule.tz import UTC, resolve_zone
from .errors import ConfigurationError, ReplicronError
from .triggers import cron, upcoming

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other replicron error; `--help` shows the usage.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="replicron",
        description="Scheduled jobs run exactly once across replicas: inspect a cluster, "
        "manage its database, try it out.",
    )
    parser.add_argument("--version", action="version", version=f"replicron {__version__}")
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
    for name, text in (
        ("migrate", "create or upgrade replicron's tables in a PostgreSQL database"),
        ("status", "show each job's last run, last success, running runs and misses"),
    ):
        command = commands.add_parser(name, help=text, description=text[0].upper() + text[1:])
        command.add_argument(
            "--database-url",
            default=os.environ.get("REPLICRON_DATABASE_URL"),
            help="PostgreSQL URL (default: $REPLICRON_DATABASE_URL)",
        )
        if name == "status":
            command.add_argument("--namespace", default="", help="job namespace (default none)")
    demo = commands.add_parser(
        "demo",
        help="run replicas that share a backend and show every tick run exactly once",
        description="Start several replica processes with the same two jobs on one shared "
        "backend (a temporary embedded state directory, or PostgreSQL with --database-url), "
        "print who ran each tick, then a summary. Exit status 0 when no tick ran twice and "
        "none was missed.",
    )
    demo.add_argument("--seconds", type=float, default=15.0, help="how long to watch (default 15)")
    demo.add_argument("--replicas", type=int, default=3, help="how many replicas (default 3)")
    demo.add_argument(
        "--database-url",
        help="PostgreSQL URL to coordinate through (default: the embedded backend in a "
        "temporary directory); the demo uses a namespace of its own",
    )
    demo.add_argument(
        "--keep", action="store_true", help="keep the temporary state directory and logs"
    )
    return parser


def _database_url(args: argparse.Namespace) -> str:
    if not args.database_url:
        raise ValueError("--database-url (or REPLICRON_DATABASE_URL) is required")
    return str(args.database_url)


def _cmd_migrate(args: argparse.Namespace) -> int:
    from .postgres import migrate

    url = _database_url(args)
    applied = asyncio.run(migrate(url))
    where = mask_dsn(url)
    if applied:
        for name in applied:
            print(f"applied {name} to {where}")
    else:
        print(f"{where} is up to date")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import psycopg.errors

    from .postgres import PostgresBackend

    url = _database_url(args)

    async def fetch() -> tuple[list[Any], list[Any], dict[str, int]]:
        backend = PostgresBackend(url, namespace=args.namespace, migrate=False)
        await backend.open("replicron-cli")
        try:
            rows = await backend.status()
            others = {} if rows else await backend.namespaces()
            return rows, await backend.replicas(), others
        finally:
            await backend.close()

    try:
        rows, replicas, namespaces = asyncio.run(fetch())
    except psycopg.errors.UndefinedTable:
        raise ConfigurationError(
            f"{mask_dsn(url)} has no replicron tables: run `replicron migrate` on it first"
        ) from None
    if not rows:
        print(f"no runs recorded in namespace {args.namespace!r}")
        if namespaces:
            listed = ", ".join(f"{name!r} ({count} runs)" for name, count in namespaces.items())
            print(f"namespaces with runs: {listed}; choose one with --namespace")
        _print_replicas(replicas)
        return 0
    header = ("JOB", "LAST TICK", "OUTCOME", "REPLICA", "LAST SUCCESS", "RUNNING", "MISSED")
    table = [header]
    for row in rows:
        table.append(
            (
                row.job,
                _iso(row.last_scheduled_at),
                row.last_outcome or "-",
                row.last_replica or "-",
                _iso(row.last_success_at),
                ", ".join(f"{replica}#{run_id}" for replica, run_id in row.running) or "-",
                str(row.missed),
            )
        )
    _print_table(table)
    for row in rows:
        if row.last_error:
            print(f"{row.job}: last error: {row.last_error}")
        for replica, run_id in row.stale_running:
            print(
                f"{row.job}: run {run_id} of replica {replica} stopped heartbeating; while its "
                "session holds the job's lock (a frozen process), the job is blocked"
            )
    _print_replicas(replicas)
    return 0


def _print_replicas(replicas: list[Any]) -> None:
    """Replicas seen by their heartbeats, with how far each one's clock is off the
    database's (replicron schedules on the database's clock; a large offset is a host to
    fix)."""
    if not replicas:
        return
    print()
    table = [("REPLICA", "ALIVE", "LAST SEEN", "CLOCK OFFSET")]
    for replica in replicas:
        offset = "-" if replica.clock_offset is None else f"{-replica.clock_offset:+.3f} s"
        alive = "yes" if replica.alive else "no"
        table.append((replica.replica_id, alive, _iso(replica.last_seen), offset))
    _print_table(table)


def _print_table(table: Sequence[Sequence[str]]) -> None:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def _iso(instant: datetime | None) -> str:
    return "-" if instant is None else instant.astimezone(UTC).isoformat(timespec="seconds")


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo.parent import run_demo

    return run_demo(args.seconds, args.replicas, args.database_url, args.keep)


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
    commands = {
        "next": _cmd_next,
        "migrate": _cmd_migrate,
        "status": _cmd_status,
        "demo": _cmd_demo,
    }
    try:
        return commands[args.command](args)
    except (ReplicronError, ValueError) as exc:
        print(f"replicron: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"replicron: error: {exc}: install replicron[postgres]", file=sys.stderr)
        return 2
    except Exception as exc:  # psycopg errors and the like: one line, never a password
        print(f"replicron: error: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    return mask_dsn(" ".join(str(exc).split()))


if __name__ == "__main__":
    sys.exit(main())
