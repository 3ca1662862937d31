"""The status page's HTML, rendered on the server from a :class:`ClusterStatus`.

Every piece of text that comes from the cluster (job names, triggers, errors, replica ids)
goes through :func:`html.escape`; error text also goes through :func:`mask_dsn`, since a
job's exception may quote the URL it failed to reach, password included.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from replicron.cluster import (
    ClusterStatus,
    JobState,
    JobView,
    Problem,
    ProblemKind,
    ReplicaStatus,
    Severity,
)
from replicron.dsn import mask_dsn
from replicron.events import Outcome

from .style import STYLE

__all__ = ["error_page", "status_page"]

#: A problem's colour, and where its job comes in the table (jobs without one come last).
_SEVERITY_CLASS = {Severity.ERROR: "bad", Severity.WARNING: "warn"}
_SEVERITY_RANK = {Severity.ERROR: 0, Severity.WARNING: 1}
#: The colour of a state that is no problem (the others: "mute").
_QUIET_CLASS = {JobState.RUNNING: "info", JobState.OK: "ok"}
#: A dot in the tab's icon: the state of the cluster at a glance, among other tabs.
_ICON = (
    "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
    "%3Ccircle cx='8' cy='8' r='7' fill='%23{}'/%3E%3C/svg%3E"
)
_ICON_COLOUR = {"ok": "1c7c43", "bad": "b4232c"}


#: Column headings and their share of a wide screen's width (0: what is left).
_JOB_COLUMNS = (
    ("Job", 18),
    ("Status", 17),
    ("Last run", 15),
    ("Last success", 10),
    ("Next due", 11),
    ("Missed 24 h", 6),
    ("Last error", 0),
)
_REPLICA_COLUMNS = (
    ("Replica", 18),
    ("State", 10),
    ("Last seen", 13),
    ("Started", 13),
    ("Clock offset", 12),
    ("Jobs", 0),
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def status_page(status: ClusterStatus, *, title: str, refresh: float, base: str) -> str:
    """The whole page. ``base`` is the path the app is mounted at (no trailing slash)."""
    jobs = [(view, status.job_problems(view)) for view in status.jobs]
    problems = [mask_dsn(problem.line) for _, found in jobs for problem in found]
    now = status.read_at
    body = "".join(
        (
            _header(status, title, refresh, base),
            _tiles(status, jobs),
            _problems(problems),
            _section("Jobs", _jobs_table(status, sorted(jobs, key=_order), now), len(status.jobs)),
            _replicas_section(status, now),
            _footer(now, refresh, base),
        )
    )
    head_title = f"({len(problems)}) {title}" if problems else title
    if status.namespace:
        head_title += f" · {status.namespace}"
    return _document(head_title, refresh, "bad" if problems else "ok", body)


def error_page(message: str, *, title: str, refresh: float, base: str) -> str:
    """The page shown when the status cannot be read: ``message`` is one line, masked."""
    body = (
        f'<header class="top"><div><h1>{_e(title)}</h1>'
        '<div class="sub">status unavailable</div></div>'
        f'<div class="meta">retries every {_e(_refresh_text(refresh))}</div></header>'
        '<section class="panel failure"><h2>Cannot read the cluster\'s status</h2>'
        "<div>Reading it failed; the page tries again on its own.</div>"
        f"<pre>{_e(mask_dsn(message))}</pre></section>"
    )
    return _document(f"(unavailable) {title}", refresh, "bad", body)


def _document(head_title: str, refresh: float, icon: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta http-equiv="refresh" content="{_refresh_seconds(refresh)}">'
        '<meta name="robots" content="noindex">'
        f'<link rel="icon" href="{_ICON.format(_ICON_COLOUR[icon])}">'
        f"<title>{_e(head_title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def _refresh_seconds(refresh: float) -> int:
    # Browsers read the meta refresh as whole seconds.
    return max(1, math.ceil(refresh))


def _refresh_text(refresh: float) -> str:
    return f"{_refresh_seconds(refresh)} s"


# ---- the parts ----------------------------------------------------------------------------


def _header(status: ClusterStatus, title: str, refresh: float, base: str) -> str:
    namespace = (
        f"<b>{_e(status.namespace)}</b>" if status.namespace else '<b class="none">(none)</b>'
    )
    return (
        f'<header class="top"><div><h1>{_e(title)}</h1>'
        f'<div class="sub">namespace {namespace} · read at <b>{_e(_full(status.read_at))}</b>'
        "</div></div>"
        f'<div class="meta">refreshes every {_e(_refresh_text(refresh))} · '
        f'<a href="{_e(base)}/status.json">status.json</a></div></header>'
    )


def _tiles(status: ClusterStatus, jobs: list[_Job]) -> str:
    failing = sum(1 for _, found in jobs if _worst(found) is Severity.ERROR)
    overdue = sum(1 for _, found in jobs if any(p.kind is ProblemKind.OVERDUE for p in found))
    running = sum(1 for view, _ in jobs if view.running)
    paused = sum(1 for view, _ in jobs if view.paused is not None)
    alive = len(status.live_replicas)
    tiles = (
        ("Jobs", str(len(jobs)), "info"),
        ("Failing", str(failing), "bad" if failing else "ok"),
        ("Overdue", str(overdue), "warn" if overdue else "ok"),
        ("Running now", str(running), "info"),
        ("Paused", str(paused), "warn" if paused else "ok"),
        ("Replicas alive", str(alive), "ok" if alive else "warn"),
    )
    cells = "".join(
        f'<div class="tile {kind}"><div class="n num">{_e(value)}</div>'
        f'<div class="l">{_e(label)}</div></div>'
        for label, value, kind in tiles
    )
    return f'<div class="tiles">{cells}</div>'


def _problems(problems: list[str]) -> str:
    if not problems:
        return '<section class="panel allgood">✓ All good: no problems</section>'
    items = "".join(f"<li>{_e(line)}</li>" for line in problems)
    return (
        f'<section class="panel problems"><h2>Problems ({len(problems)})</h2>'
        f"<ul>{items}</ul></section>"
    )


def _section(name: str, table: str, count: int) -> str:
    return f"<section><h2>{_e(name)} ({count})</h2>{table}</section>"


def _footer(now: datetime, refresh: float, base: str) -> str:
    return (
        f"<footer>Read at {_e(_iso(now))} (the coordinator's clock); times are UTC. "
        f"Refreshes every {_e(_refresh_text(refresh))}. Machine-readable: "
        f'<a href="{_e(base)}/status.json">status.json</a>.</footer>'
    )


# ---- jobs -------------------------------------------------------------------------------


#: A job and its problems.
_Job = tuple[JobView, tuple[Problem, ...]]


def _worst(problems: Iterable[Problem]) -> Severity | None:
    return min((p.severity for p in problems), key=_SEVERITY_RANK.__getitem__, default=None)


def _order(job: _Job) -> tuple[int, str]:
    """Jobs to act on first, the worst first, then the rest, each by name."""
    view, problems = job
    worst = _worst(problems)
    return (len(_SEVERITY_RANK) if worst is None else _SEVERITY_RANK[worst]), view.job


def _jobs_table(status: ClusterStatus, jobs: Iterable[_Job], now: datetime) -> str:
    rows = "".join(_job_row(status, view, problems, now) for view, problems in jobs)
    if not rows:
        return '<div class="panel allgood none">No jobs registered or run yet.</div>'
    return _table("jobs", _JOB_COLUMNS, rows)


def _job_row(
    status: ClusterStatus, view: JobView, problems: tuple[Problem, ...], now: datetime
) -> str:
    badges, details = _job_state(status, view, problems, now)
    worst = _worst(problems)
    trigger = (
        f'<div class="trigger mono">{_e(view.trigger)}</div>'
        if view.trigger
        else '<div class="trigger">not registered by any replica</div>'
    )
    badge_html = "".join(f'<span class="badge {kind}">{_e(word)}</span>' for word, kind in badges)
    state = f'<div class="badges">{badge_html}</div>{"".join(details)}'
    missed = (
        f'<span class="num warn">{view.missed}</span>'
        if view.missed
        else '<span class="num none">0</span>'
    )
    error = _or_dash(
        view.last_error and f'<div class="error mono">{_e(mask_dsn(view.last_error))}</div>'
    )
    cells = (
        ("Job", f'<div class="job">{_e(view.job)}</div>{trigger}{_scheduled_by(view)}', "lead"),
        ("Status", state, ""),
        ("Last run", _last_run(view, now), ""),
        ("Last success", _when(view.last_success_at, now, never="never"), ""),
        ("Next due", _when(view.next_due, now, never="none expected"), ""),
        ("Missed 24 h", missed, ""),
        ("Last error", error, ""),
    )
    tds = "".join(_td(*cell) for cell in cells)
    return f'<tr class="{_SEVERITY_CLASS[worst]}">{tds}</tr>' if worst else f"<tr>{tds}</tr>"


def _or_dash(content: str | None) -> str:
    """``content``, or a dash where there is none."""
    return content or '<span class="none">—</span>'


def _td(label: str, content: str, css_class: str) -> str:
    # The label shows beside the value where the table collapses into cards (narrow screens).
    attrs = f' class="{css_class}"' if css_class else ""
    return f'<td data-label="{_e(label)}"{attrs}><div>{content}</div></td>'


def _job_state(
    status: ClusterStatus, view: JobView, problems: tuple[Problem, ...], now: datetime
) -> tuple[list[tuple[str, str]], list[str]]:
    """The job's states (:meth:`ClusterStatus.job_states`) as words with a colour each, and
    a line of detail per notable one."""
    badges = [(state.value, _state_class(state)) for state in status.job_states(view, problems)]
    details: list[str] = []
    for kind in dict.fromkeys(p.kind for p in sorted(problems, key=_severity_rank)):
        details += _problem_detail(kind, view, now)
    if view.running:
        who = ", ".join(f"{_e(r)} (run {run})" for r, run in view.running)
        details.append(f'<div class="detail">running on {who}</div>')
    if view.paused is not None:
        details.append(
            f'<div class="detail">paused by {_e(view.paused.paused_by)}, '
            f"{_e(_span(now - view.paused.paused_at))} ago</div>"
        )
    return badges, details


def _severity_rank(problem: Problem) -> int:
    return _SEVERITY_RANK[problem.severity]


def _state_class(state: JobState) -> str:
    severity = state.severity
    if severity is not None:
        return _SEVERITY_CLASS[severity]
    return _QUIET_CLASS.get(state, "mute")


def _problem_detail(kind: ProblemKind, view: JobView, now: datetime) -> list[str]:
    """A problem's facts, shorter than its line in the problems panel above."""
    if kind is ProblemKind.OVERDUE and view.overdue_since is not None:
        return [
            f'<div class="detail warn">tick due {_e(_short(view.overdue_since, now))} has no '
            f"run ({_e(_span(now - view.overdue_since))} late)</div>"
        ]
    if kind is ProblemKind.BLOCKED:
        who = ", ".join(f"{_e(r)} (run {run})" for r, run in view.blocked_by)
        return [f'<div class="detail bad">blocked by a frozen run: {who}</div>']
    if kind is ProblemKind.DRIFT:
        shapes = "".join(
            f'<div><b>{_e(r.replica_id)}</b>: <span class="mono">{_e(r.trigger)}</span></div>'
            for r in view.drift
        )
        return [f'<div class="detail warn">replicas disagree:{shapes}</div>']
    return []  # a failed run: its outcome and error have columns of their own


def _scheduled_by(view: JobView) -> str:
    replicas = view.scheduled_by
    if not replicas:
        return '<div class="small">no live replica schedules it</div>'
    # A long list of replicas would push the job's own facts out of sight.
    who = ", ".join(replicas) if len(replicas) <= 3 else f"{len(replicas)} live replicas"
    return f'<div class="small">scheduled by {_e(who)}</div>'


def _last_run(view: JobView, now: datetime) -> str:
    if view.last_outcome is None and view.last_scheduled_at is None:
        return '<span class="none">never</span>'
    outcome = view.last_outcome or "running"
    kind = _outcome_class(view.outcome)
    parts = [f'<span class="outcome {kind}">{_e(outcome.replace("_", " "))}</span>']
    if view.last_scheduled_at is not None:
        parts.append(f" · {_when(view.last_scheduled_at, now, prefix='tick ')}")
    extra = []
    if view.last_replica:
        extra.append(f"on {_e(view.last_replica)}")
    duration = view.last_duration
    if duration is not None:
        extra.append(f"took {_e(_duration(duration))}")
    if extra:
        parts.append(f'<div class="small">{" · ".join(extra)}</div>')
    return "".join(parts)


def _outcome_class(outcome: Outcome | None) -> str:
    if outcome is None or outcome is Outcome.PAUSED:
        return ""
    if outcome.is_failure:
        return "bad"
    return "ok" if outcome.ran else "warn"  # missed or skipped: a tick that did not run


# ---- replicas -----------------------------------------------------------------------------


def _replicas_section(status: ClusterStatus, now: datetime) -> str:
    """The live replicas, then the departed ones folded away: a row per process that ever
    ran (by default), history rather than the cluster's state."""
    live = sorted(status.live_replicas, key=lambda r: r.replica_id)
    departed = status.departed_replicas
    if not live and not departed:
        table = '<div class="panel allgood none">No replica has registered.</div>'
    elif live:
        table = _replicas_table(status, live, now)
    else:
        table = '<div class="panel nobody">No replica is alive.</div>'
    if departed:
        table += (
            f'<details class="departed"><summary>{len(departed)} departed (stopped or died),'
            f" the latest seen first</summary>{_replicas_table(status, departed, now)}</details>"
        )
    heading = f"Replicas ({len(live)} alive" + (f", {len(departed)} departed)" if departed else ")")
    return f"<section><h2>{_e(heading)}</h2>{table}</section>"


def _replicas_table(status: ClusterStatus, replicas: Iterable[ReplicaStatus], now: datetime) -> str:
    rows = "".join(_replica_row(r, now, r.replica_id == status.leader) for r in replicas)
    return _table("replicas", _REPLICA_COLUMNS, rows)


def _table(name: str, columns: tuple[tuple[str, int], ...], rows: str) -> str:
    cols = "".join(f'<col style="width:{width}%">' if width else "<col>" for _, width in columns)
    head = "".join(f"<th>{_e(label)}</th>" for label, _ in columns)
    return (
        f'<div class="panel tablewrap"><table class="cards {name}"><colgroup>{cols}</colgroup>'
        f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _replica_row(replica: ReplicaStatus, now: datetime, leads: bool) -> str:
    state = (
        '<span class="badge ok">ALIVE</span>'
        if replica.alive
        else '<span class="badge mute">GONE</span>'
    )
    if leads:  # leader mode: it claims every leader-mode tick
        state += ' <span class="badge info">LEADER</span>'
    pid = (
        f'<div class="small">{_e(replica.pid_label)} {replica.backend_pid}</div>'
        if replica.backend_pid
        else ""
    )
    names = ", ".join(replica.jobs)
    jobs = _or_dash(names and f'<span class="mono">{_e(names)}</span>')
    cells = (
        ("Replica", f'<div class="job mono">{_e(replica.replica_id)}</div>{pid}', "lead"),
        ("State", state, ""),
        ("Last seen", _when(replica.last_seen, now), ""),
        ("Started", _when(replica.started_at, now), ""),
        ("Clock offset", _offset(replica.clock_offset), ""),
        ("Jobs", jobs, ""),
    )
    return f"<tr>{''.join(_td(*cell) for cell in cells)}</tr>"


def _offset(seconds: float | None) -> str:
    if seconds is None:
        return '<span class="none">not measured</span>'
    if abs(seconds) < 0.0005:
        return '<span class="num">in sync</span>'
    side = "behind" if seconds > 0 else "ahead"
    size = abs(seconds)
    amount = f"{size * 1000:.0f} ms" if size < 1 else f"{size:.2f} s"
    return f'<span class="num">{amount} {side}</span>'


# ---- time ---------------------------------------------------------------------------------


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat(timespec="seconds")


def _full(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short(instant: datetime, now: datetime) -> str:
    """The instant in UTC, without the date when it is the same day as ``now``."""
    utc = instant.astimezone(UTC)
    if utc.date() == now.astimezone(UTC).date():
        return utc.strftime("%H:%M:%S UTC")
    return utc.strftime("%Y-%m-%d %H:%M UTC")


def _when(instant: datetime | None, now: datetime, *, never: str = "—", prefix: str = "") -> str:
    """How long ago (or ahead) ``instant`` is, with the instant itself beneath."""
    if instant is None:
        return f'<span class="none">{_e(never)}</span>'
    delta = now - instant
    if abs(delta) < timedelta(seconds=1):
        relative = "just now"
    elif delta > timedelta(0):
        relative = f"{_span(delta)} ago"
    else:
        relative = f"in {_span(-delta)}"
    return (
        f'<time datetime="{_e(_iso(instant))}" title="{_e(_full(instant))}">{_e(relative)}'
        f'</time><div class="small">{_e(prefix)}{_e(_short(instant, now))}</div>'
    )


def _span(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{seconds // 60} min"
    if seconds < 48 * 3600:
        hours, minutes = divmod(seconds // 60, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(seconds // 3600, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 0.001:
        return "< 1 ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return _span(delta)
