"""How ``replicron status`` prints the cluster: a table of jobs, a line per thing to know
about a job, the replicas; or JSON; and with ``--check`` an exit status for alerting."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

from ._schedule.tz import UTC
from .cluster import ClusterStatus, JobView, Problem, ProblemKind

__all__ = ["print_status"]


def print_status(
    status: ClusterStatus,
    namespaces: dict[str, int],
    *,
    as_json: bool,
    check: bool,
    departed: bool = False,
) -> int:
    """Print ``status``; the exit status. The replicas table lists the live replicas, and
    the departed ones too with ``departed``."""
    problems = status.problems()
    if as_json:
        print(json.dumps(status.to_json(), indent=2))
    elif check:
        for line in problems:
            print(line)
        if not problems:
            print(f"OK: {len(status.jobs)} jobs; none overdue, drifting, blocked or failing")
    else:
        _print_view(status, namespaces, departed)
    return 1 if check and problems else 0


def _print_view(status: ClusterStatus, namespaces: dict[str, int], departed: bool) -> None:
    if not status.jobs:
        print(f"no runs recorded in namespace {status.namespace!r}")
        if namespaces:
            listed = ", ".join(f"{name!r} ({count} runs)" for name, count in namespaces.items())
            print(f"namespaces with runs: {listed}; choose one with --namespace")
        _print_replicas(status, departed)
        return
    table = [
        (
            "JOB",
            "LAST TICK",
            "OUTCOME",
            "REPLICA",
            "TOOK",
            "LAST SUCCESS",
            "RUNNING",
            "NEXT DUE",
            "STATE",
            "MISSED 24H",
        ),
    ]
    notes = []
    for view in status.jobs:
        problems = status.job_problems(view)
        notes += [f"{view.job}: {note}" for note in _notes(view, problems)]
        table.append(
            (
                view.job,
                _iso(view.last_scheduled_at),
                view.last_outcome or "-",
                view.last_replica or "-",
                _took(view.last_duration),
                _iso(view.last_success_at),
                ", ".join(f"{replica}#{run_id}" for replica, run_id in view.running) or "-",
                _iso(view.next_due),
                ",".join(status.job_states(view, problems)),
                str(view.missed),
            )
        )
    _print_table(table)
    for line in notes:
        print(line)
    _print_replicas(status, departed)


def _notes(view: JobView, problems: Sequence[Problem]) -> list[str]:
    """The lines below the table: the job's problems, as ``--check`` words them, then what
    else to know. A failed last run shows as its outcome in the row and its error here."""
    notes = [p.text for p in problems if p.kind is not ProblemKind.LAST_RUN_FAILED]
    if view.paused is not None:
        notes.append(f"paused by {view.paused.paused_by} at {_iso(view.paused.paused_at)}")
    outcome = view.outcome
    if view.last_error and (outcome is None or outcome.ran):
        notes.append(f"last error: {view.last_error}")
    return notes


def _print_replicas(status: ClusterStatus, departed: bool) -> None:
    """The live replicas (and with ``departed`` the others), with how far each one's clock
    is off the coordinator's (replicron schedules on the coordinator's clock; a large
    offset is a host to fix). Departed replicas are history: a row per process that ever
    ran, by default, so they are counted unless asked for."""
    listed = status.live_replicas + (status.departed_replicas if departed else ())
    hidden = () if departed else status.departed_replicas
    if not listed and not hidden:
        return
    print()
    if listed:
        table = [("REPLICA", "ALIVE", "JOBS", "LAST SEEN", "CLOCK OFFSET")]
        for replica in listed:
            offset = "-" if replica.clock_offset is None else f"{-replica.clock_offset:+.3f} s"
            alive = "yes" if replica.alive else "no"
            jobs = str(len(replica.jobs))
            table.append((replica.replica_id, alive, jobs, _iso(replica.last_seen), offset))
        _print_table(table)
    else:
        print("no live replica")
    if hidden:
        print(
            f"{_count(len(hidden), 'departed replica')} not listed (the latest, "
            f"{hidden[0].replica_id}, last seen {_iso(hidden[0].last_seen)}): --departed "
            "lists them"
        )
    if status.leader is not None:
        print(f"leader: {status.leader}")


def _print_table(table: Sequence[Sequence[str]]) -> None:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        print("  ".join(cells).rstrip())


def _iso(instant: datetime | None) -> str:
    return "-" if instant is None else instant.astimezone(UTC).isoformat(timespec="seconds")


def _took(duration: timedelta | None) -> str:
    if duration is None:
        return "-"
    seconds = duration.total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" if number == 1 else f"{number} {thing}s"
