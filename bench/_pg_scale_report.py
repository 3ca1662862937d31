"""What bench/pg_scale.py measured, and how it is shown: the table, the targets, the plot."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPLICAS = ("r1", "r2", "r3")
TASK_MS = 5.0
#: Cores' worth of other processes' CPU above which the figures are flagged.
BUSY_MACHINE = 0.25
Key = tuple[str, int, str]  # library, jobs, schedule


@dataclass
class Plan:
    """One scenario for one library."""

    library: str  # replicron | apscheduler4
    jobs: int
    schedule: str  # every-second | hourly
    seconds: float
    warmup: float
    drain: float
    task_ms: float = TASK_MS  # how long each run's sync task sleeps

    @property
    def key(self) -> Key:
        return (self.library, self.jobs, self.schedule)

    @property
    def title(self) -> str:
        if self.schedule == "hourly":
            return f"idle: {self.jobs:,} hourly jobs, none due, {self.seconds:g} s measured"
        what = "1 job" if self.jobs == 1 else f"{self.jobs:,} jobs"
        tasks, seconds = f"{self.task_ms:g} ms sync tasks", f"{self.seconds:g} s measured"
        title = f"{what} every second, {tasks}, {seconds}"
        if self.schedule == "rolling":
            title += ", each replica restarted in turn"
        return title


@dataclass
class Result:
    plan: Plan
    version: str = ""
    workers: int = 0  # worker threads per replica
    expected: int = 0  # runs of the measured ticks
    runs: int = 0
    without_run: int = 0  # measured ticks nobody ran
    duplicates: int = 0  # runs beyond the first of a tick
    lateness_ms: list[float] = field(default_factory=list)  # ascending
    share: dict[str, float] = field(default_factory=dict)  # of the runs, by replica
    taken_per_tick: float = math.nan  # replicron's on_taken answers, all replicas
    ledger_lateness_ms: list[float] = field(default_factory=list)  # started_at - tick
    ledger_without_row: int | None = None
    outcomes: Counter[str] = field(default_factory=Counter)  # the ledger's, measured ticks
    rates: dict[str, float] = field(default_factory=dict)  # server counters, per second
    top_statements: list[tuple[float, float, str]] = field(default_factory=list)  # /s, ms, what
    connections: dict[str, int] = field(default_factory=dict)  # most seen, by replica
    replica_cpu: float = math.nan  # cores
    server_cpu: float = math.nan
    other_load: float = math.nan
    start_s: float = math.nan  # slowest replica's construction, registration and start
    shutdown_s: float = math.nan
    log_kinds: Counter[str] = field(default_factory=Counter)  # the replicas' stderr records
    extra: dict[str, Any] = field(default_factory=dict)


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (``nan`` when empty)."""
    if not ordered:
        return math.nan
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}"


def ideal_ms(result: Result) -> float:
    """The last run's lateness were an instant's work spread evenly over every thread."""
    return result.plan.jobs * result.plan.task_ms / (len(REPLICAS) * result.workers)


_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (?P<what>\w+ [\w.]+: .*)$")
_TICK = re.compile(r"job '[^']*' tick \S+: ")


def log_kinds(text: str) -> Counter[str]:
    """The replicas' log records by kind: level, logger and message, job and tick left out."""
    kinds: Counter[str] = Counter()
    for line in text.splitlines():
        if match := _RECORD.match(line):
            kinds[_TICK.sub("", match["what"])[:150]] += 1
    return kinds


# ---- the table ------------------------------------------------------------------------------

Getter = Callable[[Result], float | None]


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def section(self, title: str) -> None:
        self.rows.append((title, "", ""))

    def row(self, label: str, ours: str, theirs: str = "") -> None:
        self.rows.append((f"  {label}", ours, theirs))

    def pair(self, label: str, r: Result, a: Result | None, get: Getter, digits: int = 0) -> None:
        """A row of both libraries' figure, or of replicron's alone."""
        self.row(label, fmt(get(r), digits), fmt(get(a), digits) if a else "")

    def render(self, with_aps: bool) -> str:
        header = ("", "replicron", "APScheduler 4" if with_aps else "")
        widths = [max(len(r[i]) for r in [header, *self.rows]) for i in range(3)]
        lines = []
        for label, *numbers in [header, *self.rows]:
            cells = "".join(f"  {n:>{w}}" for n, w in zip(numbers, widths[1:], strict=True))
            lines.append((label.ljust(widths[0]) + cells).rstrip())
        return "\n".join(lines)


def rate(name: str, per: float = 1.0) -> Getter:
    return lambda x: x.rates.get(name, math.nan) / per


def per_run(name: str) -> Getter:
    return lambda x: x.rates.get(name, math.nan) * x.plan.seconds / x.runs if x.runs else None


def add_burst(table: Table, r: Result, a: Result | None) -> None:
    table.section(r.plan.title)
    table.pair(f"runs (of {r.expected:,})", r, a, lambda x: x.runs)
    table.pair("ticks with no run", r, a, lambda x: x.without_run)
    table.pair("duplicate runs", r, a, lambda x: x.duplicates)
    table.pair("lateness p50 (ms)", r, a, lambda x: percentile(x.lateness_ms, 0.50), 2)
    table.pair("lateness p99 (ms)", r, a, lambda x: percentile(x.lateness_ms, 0.99), 2)
    table.pair("lateness max (ms)", r, a, lambda x: max(x.lateness_ms, default=math.nan), 2)
    table.pair("ideal last start, jobs x 5 ms / threads (ms)", r, a, ideal_ms, 1)
    table.row(
        "ledger: lateness p99 by started_at (ms)", fmt(percentile(r.ledger_lateness_ms, 0.99), 2)
    )
    table.row("ledger: ticks with no row", fmt(r.ledger_without_row))
    for outcome in sorted({"succeeded", "skipped_overlap", "missed", *r.outcomes}):
        table.row(f"ledger: {outcome}", fmt(r.outcomes[outcome]))
    table.pair(
        "largest replica's share of runs", r, a, lambda x: max(x.share.values(), default=None), 3
    )
    table.row(
        "runs by replica r1/r2/r3 (%)",
        "/".join(f"{100 * r.share.get(n, 0):.0f}" for n in REPLICAS),
        "/".join(f"{100 * a.share.get(n, 0):.0f}" for n in REPLICAS) if a else "",
    )
    table.row("on_taken answers per tick, all replicas", fmt(r.taken_per_tick, 2))
    table.pair("statements/s on the server", r, a, rate("statements"))
    table.pair("statements per run", r, a, per_run("statements"), 2)
    table.pair("rows/s returned by statements", r, a, rate("statement_rows"))
    table.pair("commits/s", r, a, rate("xact_commit"))
    table.pair("rows inserted/s", r, a, rate("tup_inserted"))
    table.pair("rows updated/s", r, a, rate("tup_updated"))
    table.pair("rows fetched/s", r, a, rate("tup_fetched"))
    table.pair("deadlocks", r, a, lambda x: x.rates.get("deadlocks", math.nan) * x.plan.seconds)
    add_machine(table, r, a)


def add_idle(table: Table, r: Result, a: Result | None) -> None:
    table.section(r.plan.title)
    n = len(REPLICAS)
    table.pair("statements/s per replica", r, a, rate("statements", n), 2)
    table.pair("commits/s per replica", r, a, rate("xact_commit", n), 2)
    add_machine(table, r, a)


def add_machine(table: Table, r: Result, a: Result | None) -> None:
    table.pair(
        "connections per replica (most seen)",
        r,
        a,
        lambda x: max(x.connections.values(), default=None),
    )
    table.pair("replicas' CPU (cores)", r, a, lambda x: x.replica_cpu, 2)
    table.pair("server's CPU (cores)", r, a, lambda x: x.server_cpu, 2)
    table.pair("other processes' load (cores)", r, a, lambda x: x.other_load, 2)


# ---- the targets ----------------------------------------------------------------------------


@dataclass
class Target:
    label: str
    shown: str
    passed: bool | None  # None: not measured in this run


def burst_targets(r600: Result | None) -> list[Target]:
    if r600 is None:
        return [Target("600 jobs: the burst targets", "not measured", None)]
    p99 = percentile(r600.lateness_ms, 0.99)
    share = max(r600.share.values(), default=math.nan)
    missing = max(r600.without_run, r600.ledger_without_row or 0)
    skipped = r600.outcomes["skipped_overlap"]
    return [
        Target(
            "600 jobs: every tick ran exactly once",
            f"{r600.duplicates} duplicate runs, {missing} ticks with no run",
            r600.duplicates == 0 and missing == 0 and r600.runs == r600.expected,
        ),
        Target("600 jobs: no tick skipped_overlap", str(skipped), skipped == 0),
        Target("600 jobs: p99 start lateness <= 150 ms", f"{fmt(p99, 1)} ms", p99 <= 150.0),
        Target("600 jobs: no replica runs over half", fmt(share, 3), share <= 0.5),
    ]


def rolling_target(rolling: Result | None) -> Target:
    label = "600 jobs, rolling restart: 0 missed"
    if rolling is None:
        return Target(label, "not measured", None)
    missed = rolling.outcomes["missed"]
    missing = max(rolling.without_run, rolling.ledger_without_row or 0)
    shown = f"{missed} missed, {rolling.duplicates} duplicate runs, {missing} ticks with no run"
    return Target(label, shown, missed == 0 and rolling.duplicates == 0 and missing == 0)


def one_job_target(r1: Result | None, a1: Result | None) -> Target:
    label = "1 job: p99 <= 1/3 of APScheduler 4's"
    if r1 is None or a1 is None:
        return Target(label, "not measured", None)
    ours, theirs = percentile(r1.lateness_ms, 0.99), percentile(a1.lateness_ms, 0.99)
    ratio = ours / theirs if theirs else math.nan
    ours_max = max(r1.lateness_ms, default=math.nan)
    theirs_max = max(a1.lateness_ms, default=math.nan)
    shown = (
        f"{fmt(ratio, 3)} ({fmt(ours, 2)} vs {fmt(theirs, 2)} ms; "
        f"max {fmt(ours_max, 2)} vs {fmt(theirs_max, 2)} ms)"
    )
    return Target(label, shown, ratio <= 1 / 3)


def idle_target(idle: Result | None) -> Target:
    label = "idle: <= 1 statement/s per replica"
    if idle is None:
        return Target(label, "not measured", None)
    per_second, what = idle.rates.get("statements"), "statements"
    if per_second is None:  # no pg_stat_statements: commits (autocommit: one per statement)
        per_second, what = idle.rates["xact_commit"], "commits"
    per_replica = per_second / len(REPLICAS)
    return Target(label, f"{per_replica:.2f} {what}/s", per_replica <= 1.0)


def targets(results: dict[Key, Result]) -> list[Target]:
    return [
        *burst_targets(results.get(("replicron", 600, "every-second"))),
        rolling_target(results.get(("replicron", 600, "rolling"))),
        one_job_target(
            results.get(("replicron", 1, "every-second")),
            results.get(("apscheduler4", 1, "every-second")),
        ),
        idle_target(results.get(("replicron", 1000, "hourly"))),
    ]


# ---- the report -----------------------------------------------------------------------------


def render(results: dict[Key, Result], header: list[str]) -> tuple[str, list[Target]]:
    """The whole report (header, table, notes, targets) and the targets."""
    with_aps = any(key[0] == "apscheduler4" for key in results)
    table = Table()
    for key, result in results.items():
        if key[0] != "replicron":
            continue
        theirs = results.get(("apscheduler4", key[1], key[2]))
        (add_idle if key[2] == "hourly" else add_burst)(table, result, theirs)
    checks = targets(results)
    lines = [*header, "", table.render(with_aps)]
    if remarks := notes(results):
        lines += ["", *remarks]
    lines += ["", "Targets"]
    for check in checks:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[check.passed]
        lines.append(f"  {verdict}  {check.label:<40} {check.shown}")
    return "\n".join(lines), checks


def notes(results: dict[Key, Result]) -> list[str]:
    lines = []
    for (library, jobs, schedule), result in results.items():
        name = f"{library}, {jobs:,} {'hourly' if schedule == 'hourly' else 'per-second'} jobs"
        if result.top_statements:
            top = "; ".join(
                f"{name} {per_s:,.1f}/s {ms:.2f} ms" for per_s, ms, name in result.top_statements
            )
            lines.append(f"note: {name}, busiest statements: {top}")
        for kind, count in result.log_kinds.most_common(3):
            lines.append(f"note: {name}, replicas logged {count} x {kind}")
        if result.extra.get("other_connections"):
            lines.append(f"note: {name}, other connections: {result.extra['other_connections']}")
    busiest = max(r.other_load for r in results.values())
    if busiest > BUSY_MACHINE:
        lines.append(
            f"warning: other processes used up to {busiest:.2f} cores during a window; "
            "these figures are not reliable"
        )
    return lines


# ---- the plot -------------------------------------------------------------------------------


def plot(results: dict[Key, Result], path: Path, subtitle: str = "") -> str:
    """CDFs of start lateness per scenario, written to ``path``; says what it did.

    A curve rises to the fraction of the measured ticks that ran, not to 1: a library that
    let ticks go by without a run stays below the top."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return "plot skipped: no matplotlib (.venv/bin/python -m pip install -e '.[bench]')"
    every = "every-second"
    panels: list[tuple[str, list[Key]]] = [
        ("1 job", [("replicron", 1, every), ("apscheduler4", 1, every)]),
        ("600 jobs", [("replicron", 600, every), ("apscheduler4", 600, every)]),
        ("replicron, N jobs", [("replicron", n, every) for n in (100, 600, 2000)]),
    ]
    panels = [
        (title, [k for k in keys if results.get(k) and results[k].lateness_ms])
        for title, keys in panels
    ]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        return "plot skipped: no runs to plot"
    figure, axes = plt.subplots(
        1, len(panels), figsize=(5.4 * len(panels), 5.6), squeeze=False, layout="constrained"
    )
    for axis, (title, keys) in zip(axes[0], panels, strict=True):
        top, low, high = 1.0, math.inf, 0.0
        for key in keys:
            result = results[key]
            xs = [max(x, 0.01) for x in result.lateness_ms]  # a log scale
            ticks = result.expected or len(xs)
            ys = [(i + 1) / ticks for i in range(len(xs))]
            name = "replicron" if key[0] == "replicron" else f"APScheduler {result.version}"
            if title.startswith("replicron"):
                name = f"{key[1]:,} jobs (ideal last start {ideal_ms(result):.0f} ms)"
            ran = ticks - result.without_run if result.expected else len(xs)
            p99 = fmt(percentile(result.lateness_ms, 0.99), 1)
            label = f"{name}\n{ran:,} of {ticks:,} ticks ran; p99 of the runs {p99} ms"
            axis.step([xs[0], *xs], [0.0, *ys], where="post", label=label)
            top, low, high = max(top, ys[-1]), min(low, xs[0]), max(high, xs[-1])
        seconds = {f"{results[k].plan.seconds:g}" for k in keys}
        axis.set_title(f"{title} every second, {'/'.join(sorted(seconds))} s measured")
        axis.axhline(0.99, color="grey", linestyle=":", linewidth=0.8)
        axis.set_xscale("log")
        decades = math.log10(high / low)
        subs = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0, 3.0) if decades < 4 else (1.0,)
        axis.xaxis.set_major_locator(LogLocator(subs=subs))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set_ylim(0.0, top + 0.02)
        axis.set_xlabel("start lateness: task's first time.time() - tick (ms, log scale)")
        axis.set_ylabel("fraction of the measured ticks started")
        axis.grid(True, which="major", alpha=0.4)
        axis.grid(True, which="minor", alpha=0.15)
        axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize="small")
    title = (
        f"bench/pg_scale.py: {len(REPLICAS)} replica processes, {TASK_MS:g} ms sync tasks"
        " (dotted: 99 % of the ticks)"
    )
    figure.suptitle(f"{title}\n{subtitle}" if subtitle else title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f"plot written to {path}"
