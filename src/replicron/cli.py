"""The ``replicron`` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from ._schedule.tz import UTC, resolve_zone
from .backends.base import ClusterRegistry, NamespacedRegistry, RunRequests
from .cluster import ClusterStatus
from .dsn import mask_dsn
from .errors import ConfigurationError, JobNotFoundError, ReplicronError
from .triggers import cron, upcoming

__all__ = ["main", "run_cluster_command"]

_T = TypeVar("_T")


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
    parser.set_defaults(given=None)  # a backend built by the caller (run_cluster_command)
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
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade replicron's tables in a PostgreSQL database",
        description="Create or upgrade replicron's tables in a PostgreSQL database.",
    )
    _add_database_url(migrate)
    status = commands.add_parser(
        "status",
        help="show each job's last run, success, next tick, and what is overdue or paused",
        description="Show the cluster as its shared backend has it: per job the last run "
        "(tick, outcome, replica, duration), last success, runs going on and what blocks "
        "them, next tick, overdue, paused, definition drift and misses; then the replicas.",
    )
    _add_source(status)
    status.add_argument("--json", action="store_true", help="print it as JSON")
    status.add_argument(
        "--departed",
        action="store_true",
        help="list the replicas that stopped or died too, not only the live ones (--json "
        "lists every replica)",
    )
    status.add_argument(
        "--check",
        action="store_true",
        help="exit 1, with one line per problem, when a job is overdue, drifting, blocked "
        "or its last run failed (for cron, Kubernetes probes and CI)",
    )
    for name, text in (
        ("pause", "pause a job on every replica: its ticks are recorded paused, none runs"),
        ("resume", "resume a paused job from its next tick (paused ticks are not replayed)"),
        ("forget", "expect a job dropped from the code no more (its runs stay in the ledger)"),
        ("run-now", "run a job once now on whichever replica that schedules it sees it first"),
    ):
        command = commands.add_parser(name, help=text, description=text[0].upper() + text[1:])
        command.add_argument("job", help="the job's name")
        _add_source(command)
        if name == "pause":
            command.add_argument(
                "--force",
                action="store_true",
                help="pause it though no replica has registered it (a job not deployed yet)",
            )
    run = commands.add_parser(
        "run",
        help="run the jobs of a TOML config as one replica of a cluster (the daemon)",
        description="Run the jobs of a TOML config (commands or Python callables) as one "
        "replica; start several on one backend and each tick runs once. SIGTERM/SIGINT stop "
        "it gracefully, SIGHUP reloads the config. Settings can also come from REPLICRON_* "
        "environment variables (see docs/daemon.md).",
    )
    run.add_argument("config", help="the TOML config, e.g. examples/jobs.toml")
    check = commands.add_parser(
        "check",
        help="validate a TOML config and print each job's next fire times",
        description="Validate a daemon config as `replicron run` would (triggers, time zones, "
        "options, programs on PATH, Python imports and arguments) and print each job's next "
        "fire times. Exit status 2 with one line per problem when it is invalid.",
    )
    check.add_argument("config", help="the TOML config")
    check.add_argument("-n", type=int, default=3, help="fire times per job (default 3)")
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


def _add_database_url(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--database-url",
        default=os.environ.get("REPLICRON_DATABASE_URL"),
        help="PostgreSQL URL (default: $REPLICRON_DATABASE_URL)",
    )


def _add_source(command: argparse.ArgumentParser) -> None:
    command.add_argument("--database-url", help="PostgreSQL URL (default: $REPLICRON_DATABASE_URL)")
    command.add_argument(
        "--state-dir",
        help="the embedded backend's state directory instead (default: $REPLICRON_STATE_DIR)",
    )
    command.add_argument(
        "--namespace", default="", help="job namespace on PostgreSQL (default none)"
    )
    command.add_argument(
        "--config", help="a daemon config (jobs.toml) naming the backend, instead of the above"
    )


def _backend(args: argparse.Namespace) -> tuple[ClusterRegistry, str]:
    """The shared backend the arguments (else the environment) name, and where it keeps its
    state (a masked DSN, or the state directory); never opened: its cluster methods use a
    connection of their own."""
    if args.given is not None:
        return args.given  # type: ignore[no-any-return]
    url, state_dir = args.database_url, args.state_dir
    if args.config:
        if url or state_dir:
            raise ValueError("give --config, or --database-url or --state-dir, not both")
        from .daemon import load_config

        settings = load_config(args.config).scheduler
        url, state_dir = settings.database_url, settings.state_dir or ".replicron"
        args.namespace = args.namespace or settings.namespace
        if url:
            state_dir = None
    if url and state_dir:
        raise ValueError("give --database-url or --state-dir, not both")
    if not (url or state_dir):
        url = os.environ.get("REPLICRON_DATABASE_URL")
        state_dir = None if url else os.environ.get("REPLICRON_STATE_DIR")
    if state_dir:
        from .backends.embedded import EmbeddedBackend

        if args.namespace:
            raise ValueError("--namespace applies to PostgreSQL only")
        return EmbeddedBackend(state_dir), state_dir
    if not url:
        raise ValueError(
            "--database-url (or REPLICRON_DATABASE_URL), or --state-dir for the embedded "
            "backend, is required"
        )
    from .postgres import PostgresBackend

    return PostgresBackend(url, namespace=args.namespace, migrate=False), mask_dsn(url)


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
    from ._cli_status import print_status

    async def read(backend: ClusterRegistry) -> tuple[ClusterStatus, dict[str, int]]:
        status = await backend.cluster_status()
        if status.jobs or not isinstance(backend, NamespacedRegistry):
            return status, {}
        return status, await backend.namespaces()  # to say where the jobs may be instead

    status, namespaces = _ask(args, read)
    return print_status(
        status, namespaces, as_json=args.json, check=args.check, departed=args.departed
    )


def _cmd_pause(args: argparse.Namespace) -> int:
    by = f"replicron-cli@{socket.gethostname()}"

    async def pause(backend: ClusterRegistry) -> bool:
        if not args.force:
            await _require_known(backend, args, hint="to pause a job not deployed yet, add --force")
        return await backend.pause(args.job, by)

    if _ask(args, pause):
        print(f"paused {args.job!r}: every replica records its ticks paused from its next claim")
    else:
        print(f"{args.job!r} was paused already")
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    async def resume(backend: ClusterRegistry) -> bool:
        if await backend.resume(args.job):
            return True
        await _require_known(backend, args)  # nothing was paused: a typo is said, not ignored
        return False

    if _ask(args, resume):
        print(f"resumed {args.job!r}: it runs again from its next tick")
    else:
        print(f"{args.job!r} was not paused")
    return 0


def _cmd_run_now(args: argparse.Namespace) -> int:
    by = f"replicron-cli@{socket.gethostname()}"

    async def request(backend: ClusterRegistry) -> datetime:
        if not isinstance(backend, RunRequests):
            raise ConfigurationError(f"{type(backend).__name__} keeps no run requests")
        try:
            return await backend.request_run(args.job, by)
        except JobNotFoundError:
            raise await _unknown_job(backend, args, await backend.cluster_status()) from None

    at = _ask(args, request)
    print(
        f"asked for a run of {args.job!r} at {at.astimezone(UTC).isoformat()}: the first "
        "replica that schedules it runs it once, within seconds"
    )
    return 0


async def _require_known(
    backend: ClusterRegistry, args: argparse.Namespace, hint: str = ""
) -> None:
    """Refuse a job the cluster does not know: no replica registered it and it is not paused
    (a typo, or a forgotten ``--namespace``, would otherwise be paused or resumed silently)."""
    status = await backend.cluster_status()
    view = status.job(args.job)
    if view is None or not (view.registered or view.paused is not None):
        raise await _unknown_job(backend, args, status, hint)


async def _unknown_job(
    backend: ClusterRegistry, args: argparse.Namespace, status: ClusterStatus, hint: str = ""
) -> JobNotFoundError:
    """The refusal of a job no replica registered, naming the jobs that are, and on a
    database several namespaces share, the other namespaces with runs."""
    others: list[str] = []
    if isinstance(backend, NamespacedRegistry) and args.given is None:
        others = [name for name in await backend.namespaces() if name != status.namespace]
    there = f" in namespace {status.namespace!r}" if status.namespace or others else ""
    said = [f"no replica has registered a job named {args.job!r}{there}"]
    registered = [view.job for view in status.jobs if view.registered]
    if registered:
        said.append(f"registered jobs: {_short_list(registered)}")
    else:
        said.append("none is registered" + (" there" if there else ""))
    if others:
        said.append(f"namespaces with runs: {_short_list(others)} (choose one with --namespace)")
    if hint:
        said.append(hint)
    return JobNotFoundError("; ".join(said))


def _short_list(names: Sequence[str], most: int = 10) -> str:
    listed = ", ".join(map(repr, names[:most]))
    return listed + (f" and {len(names) - most} more" if len(names) > most else "")


def _cmd_forget(args: argparse.Namespace) -> int:
    gone, live = _ask(args, lambda backend: backend.forget(args.job))
    if live:
        print(
            f"{args.job!r} is still scheduled by live replicas {', '.join(live)}: remove it "
            "from their code first"
        )
        return 1
    if gone:
        print(f"forgot {args.job!r}: no longer expected (it was registered by {', '.join(gone)})")
    else:
        print(f"{args.job!r} is not in the registry")
    return 0


def _ask(
    args: argparse.Namespace, call: Callable[[ClusterRegistry], Coroutine[Any, Any, _T]]
) -> _T:
    """``call`` on the backend the arguments name; a database without replicron's tables is
    said plainly."""
    backend, where = _backend(args)
    try:
        return asyncio.run(call(backend))
    except Exception as exc:
        if type(exc).__name__ == "UndefinedTable":
            raise ConfigurationError(
                f"{where} has no replicron tables: run `{args.migrate_with}` on it first"
            ) from None
        raise


def _cmd_run(args: argparse.Namespace) -> int:
    from .daemon import run_daemon

    return run_daemon(args.config)


def _cmd_check(args: argparse.Namespace) -> int:
    from .daemon import check_config

    if args.n < 1:
        raise ValueError(f"-n must be at least 1, got {args.n}")
    return check_config(args.config, count=args.n)


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


def run_cluster_command(
    argv: Sequence[str],
    backend: ClusterRegistry,
    where: str,
    migrate_with: str = "replicron migrate",
) -> int:
    """``replicron status|pause|resume|forget|run-now ...`` (``argv`` without the program)
    on a backend the caller built, e.g. from a Django project's settings: the same words,
    output and exit statuses. ``where`` names it in messages (never with a password);
    ``migrate_with`` is the command that creates the tables where they are missing."""
    if not argv or argv[0] not in _CLUSTER_COMMANDS:
        raise ValueError(f"not one of {', '.join(_CLUSTER_COMMANDS)}: {list(argv)!r}")
    return main(argv, given=(backend, where), migrate_with=migrate_with)


_CLUSTER_COMMANDS = ("status", "pause", "resume", "forget", "run-now")


def main(
    argv: Sequence[str] | None = None,
    *,
    given: tuple[ClusterRegistry, str] | None = None,
    migrate_with: str = "replicron migrate",
) -> int:
    args = _build_parser().parse_args(argv)
    args.given, args.migrate_with = given, migrate_with
    commands = {
        "next": _cmd_next,
        "migrate": _cmd_migrate,
        "status": _cmd_status,
        "pause": _cmd_pause,
        "resume": _cmd_resume,
        "forget": _cmd_forget,
        "run-now": _cmd_run_now,
        "demo": _cmd_demo,
        "run": _cmd_run,
        "check": _cmd_check,
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
