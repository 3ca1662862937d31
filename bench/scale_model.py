"""What a fleet of replicas asks of one PostgreSQL, on paper: replicron's statements, the
ledger, retention and the burst at each instant, from the SQL the backend sends and the costs
bench/pg_ledger.py measured.

    .venv/bin/python bench/scale_model.py                                # 100 x 10,000 per minute
    .venv/bin/python bench/scale_model.py --replicas 12 --jobs 2000 --period 10
    .venv/bin/python bench/scale_model.py --inputs ledger.json           # fresh measurements

Arithmetic, and a step-by-step walk through one replica's session at an instant; no I/O but
``--inputs``. What it takes from the code (see docs/scaling.md):

* A replica claims ahead of an instant only the ticks it is the first replica for (rendezvous
  hashing over the replicas, ``capacity.Spreader``), at most its room: ``workers`` plus
  ``claim_margin``. One ``claim`` statement.
* Every other tick of the instant stays deferred on every replica and is tried later, in
  chunks of the room left, one ``claim`` each, until it is answered (taken, or won). A tick
  whose job falls due again first is tried by ``record_unclaimed``. So each replica tries
  every tick once: R tries a tick, R - 1 of them find the row there.
* Outcomes go in one ``release`` per batch; a batch is what ended while the previous statement
  on the replica's one session was under way.
* Each replica heartbeats every 5 s and runs ``abandon_stale`` and ``prune`` (at most 1,000
  rows) every 12th heartbeat.

``model()`` returns named figures; bench/pg_fleet.py puts them next to what it measures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from replicron._engine.capacity import _hash, claim_margin

#: Costs measured by ``.venv/bin/python bench/pg_ledger.py``
#: on PostgreSQL 15.20, fsync on, a 2-core VM: server CPU (us) and WAL (bytes) per statement
#: and per tick; wall round trips on loopback (ms per statement, us per tick); the backend's
#: own CPU in this process (us per statement, per tick).
MEASURED: dict[str, Any] = {
    "claim_won": {
        "cpu": (2095.0, 16.5),
        "wal": (20.0, 520.0),
        "rtt": (2.63, 24.3),
        "client": (414.0, 7.8),
    },
    "claim_taken": {
        "cpu": (743.0, 11.1),
        "wal": (0.0, 6.0),
        "rtt": (1.09, 19.1),
        "client": (265.0, 8.0),
    },
    "release": {
        "cpu": (599.0, 13.4),
        "wal": (0.0, 575.0),
        "rtt": (0.93, 24.9),
        "client": (241.0, 11.0),
    },
    # WAL after a checkpoint, per job: the job's index pages written whole once (measured
    # with 100 rows per job; a job with a page of its own in the tick key writes at least 8 kB).
    "fpi_bytes_per_job": 4241.0,
    # Bytes per ledger row: the table as written (each row inserted, then updated: two
    # versions, 0% of the updates HOT), a live row and its line pointer; each index as written.
    "heap_written": 246.8,
    "heap_live": 161.0,
    "indexes": {"tick_key": 48.4, "pkey": 33.2, "open_idx": 0.9, "claimed_at_idx": 8.4},
    # prune: per deleted row, its subquery finds the job's latest row either backwards
    # through the primary key (about a row per job in the namespace: seconds per row per job)
    # or through the job's rows in the tick key (seconds per row per row of the job).
    "prune_by_pkey": 5.31e-8,
    "prune_by_tick_key": 6.19e-7,
    "prune_wal_per_row": 294.0,
    "abandon_stale_ms": 1.3,
    "heartbeat_ms": 0.3,  # stated (pg_fleet.py's runs: 0.13-0.5 ms mean)
    # Advisory locks held before "out of shared memory", per lock slot of the formula
    # (12,750 against 7,808 at max_connections 100).
    "lock_slack": 1.63,
}


@dataclass(frozen=True)
class Fleet:
    """What is stated: the fleet, replicron's defaults, the server's settings."""

    replicas: int = 100
    jobs: int = 10_000
    period: float = 60.0  # seconds between instants; every job is due at each
    task_s: float = 0.005  # how long a run holds its worker thread
    workers: int = 10  # Scheduler(max_workers=10)
    heartbeat_s: float = 5.0  # PostgresBackend(heartbeat_interval=5.0)
    janitor_s: float = 60.0  # every 12th heartbeat
    prune_batch: int = 1000
    retention_days: float = 14.0
    statement_timeout_s: float = 5.0  # half the lease: (15 - 5) / 2
    claim_rtt: float = 0.005  # a claim's round trip (s), as claim_margin sees it
    pruning: bool = True  # rows reach retention (a ledger older than ``retention_days``)
    # Replica CPU beyond the backend's (pg_ledger.py measures that): per tick answered, the
    # dispatcher settling it (stated); per deferred tick per claim, Spreader.split (timed on
    # its own: 0.5 us); per run, the engine (docs/benchmarks.md: 18 ms per 1,000 runs).
    settle_us: float = 3.0
    split_us: float = 0.5
    run_us: float = 18.0
    server_cores: int = 8
    max_connections: int = 100  # PostgreSQL's defaults from here on
    max_locks_per_transaction: int = 64
    other_backends: int = 22  # autovacuum 3 + its launcher + worker processes 8 + WAL senders 10
    checkpoint_s: float = 300.0
    vacuum_scale_factor: float = 0.2


KINDS = ("claim_won", "claim_taken", "release")


class Figure(NamedTuple):
    value: float
    unit: str
    how: str


@dataclass
class Costs:
    claim_won: dict[str, tuple[float, float]]
    claim_taken: dict[str, tuple[float, float]]
    release: dict[str, tuple[float, float]]
    other: dict[str, Any] = field(default_factory=dict)

    def cpu_s(self, kind: str, statements: float, ticks: float) -> float:
        a, b = getattr(self, kind)["cpu"]
        return float(a * statements + b * ticks) / 1e6

    def rtt_s(self, kind: str, ticks: float) -> float:
        a, b = getattr(self, kind)["rtt"]
        return float(a / 1e3 + b * ticks / 1e6)

    def client_s(self, kind: str, statements: float, ticks: float) -> float:
        a, b = getattr(self, kind)["client"]
        return float(a * statements + b * ticks) / 1e6

    def wal(self, kind: str, statements: float, ticks: float) -> float:
        a, b = getattr(self, kind)["wal"]
        return float(a * statements + b * ticks)


def costs(path: Path | None = None) -> Costs:
    """MEASURED, or the figures bench/pg_ledger.py --out wrote."""
    m: dict[str, Any] = json.loads(json.dumps(MEASURED))
    if path is not None:
        m.update(from_ledger(json.loads(path.read_text())))
    kinds = {k: {n: tuple(v) for n, v in m.pop(k).items()} for k in KINDS}
    return Costs(kinds["claim_won"], kinds["claim_taken"], kinds["release"], m)


def from_ledger(data: dict[str, Any]) -> dict[str, Any]:
    """The inputs in pg_ledger.py's JSON."""
    out: dict[str, Any] = {}
    for kind, f in data["fits"].items():
        small, large = data["tallies"][f"{kind}/small"], data["tallies"][f"{kind}/large"]
        n1, n2 = small["ticks"] / small["statements"], large["ticks"] / large["statements"]
        t1, t2 = small["wall_s"] / small["statements"], large["wall_s"] / large["statements"]
        slope = (t2 - t1) / (n2 - n1)
        out[kind] = {
            "cpu": (f["cpu_us_per_statement"], f["cpu_us_per_tick"]),
            "wal": (f["wal_per_statement"], f["wal_per_tick"]),
            "rtt": (max(0.0, t1 - slope * n1) * 1e3, slope * 1e6),
            "client": (f["client_us_per_statement"], f["client_us_per_tick"]),
        }
    out["fpi_bytes_per_job"] = data["fpi_bytes_per_job"]
    written = data["sizes"]["as written"]
    out["heap_written"] = written["table"]
    live = data["tuples"].get("after VACUUM") or {}
    if live:
        out["heap_live"] = live["live_bytes"] / live["live"] + 4
    out["indexes"] = {
        k.removeprefix("replicron_runs_"): v for k, v in written.items() if "_runs_" in k
    }
    for p in data["prune"].values():
        per_row = sum(p["seconds"]) / max(1, sum(p["deleted"]))
        subplan = next((line for line in p["plan"] if "latest" in line), "")
        if "pkey" in subplan:
            out["prune_by_pkey"] = per_row / p["jobs"]
        elif "tick_key" in subplan:
            out["prune_by_tick_key"] = per_row / p["instants"]
    walls = [p["wal_per_row"] for p in data["prune"].values()]
    out["prune_wal_per_row"] = sum(walls) / len(walls)
    out["abandon_stale_ms"] = max(data["abandon_stale_ms"])
    slots = data["lock_slots"].get("100") or next(iter(data["lock_slots"].values()))
    out["lock_slack"] = slots["held_before_error"] / slots["predicted"]
    return out


def shares(replicas: int, jobs: int) -> list[int]:
    """Jobs each replica is first for, by rendezvous hashing (``capacity._hash``), for
    replicas ``r01``... and jobs ``job-0000``... as bench/pg_fleet.py names them."""
    names = [f"r{i + 1:02d}" for i in range(replicas)]
    count = [0] * replicas
    for j in range(jobs):
        job = f"job-{j:04d}"
        best = max(range(replicas), key=lambda i: _hash(names[i], job))
        count[best] += 1
    return count


def prune_s_per_row(o: dict[str, Any], jobs: int, rows_per_job: float) -> float:
    """Seconds per row a prune deletes: its subquery (the job's latest row) takes the cheaper
    of the two plans the server chose between in bench/pg_ledger.py."""
    return min(float(o["prune_by_pkey"]) * jobs, float(o["prune_by_tick_key"]) * rows_per_job)


class Burst(NamedTuple):
    claims: int  # claim statements of one replica for one instant, the one ahead included
    releases: int
    storm_s: float  # from the instant to its last statement
    starts: list[float]  # its runs' starts after the instant (on the threads alone)
    cpu_s: float  # the replica's CPU for the instant


def starts(share: int, workers: int, run_s: float) -> list[float]:
    """Runs start in waves of ``workers``, each wave when the last one ends."""
    return [(k // workers) * run_s for k in range(share)]


def burst(f: Fleet, c: Costs, share: int, stretch: float = 1.0) -> Burst:
    """One replica through one instant: its claim ahead, then its session's statements one
    after another (claims of the deferred ticks in chunks of its room, releases of what
    ended meanwhile), with its own ``share`` of runs on ``workers`` threads. ``stretch``:
    how much longer than on an idle server each statement takes (the others' share it)."""
    w, d = f.workers, max(f.task_s, 1e-6)
    room = w + claim_margin(w, f.claim_rtt, f.task_s)
    ahead = min(share, room)
    claimed, deferred = ahead, f.jobs - ahead
    t, claims, releases, released, turn = 0.0, 1, 0, 0, "claim"
    cpu = c.client_s("claim_won", 1, ahead) + (share * f.run_us + ahead * f.settle_us) / 1e6

    def finished(at: float) -> int:  # runs go in waves of ``workers``
        return min(claimed, w * math.floor(at / d + 1e-9))

    while deferred > 0 or released < share:
        pending = finished(t) - released
        free = room - (claimed - finished(t))
        if pending > 0 and (turn == "release" or deferred == 0 or free < 1):
            releases += 1
            released += pending
            t += c.rtt_s("release", pending) * stretch
            cpu += c.client_s("release", 1, pending)
            turn = "claim"
        elif deferred > 0 and free >= 1:
            n = min(free, deferred)
            mine = min(n, share - claimed)  # its own leftovers first (rendezvous rank 0)
            claimed += mine
            deferred -= n
            claims += 1
            client = (n * f.settle_us + deferred * f.split_us) / 1e6
            t += c.rtt_s("claim_taken", n) * stretch + client
            cpu += c.client_s("claim_taken", 1, n) + client
            turn = "release"
        else:
            t = (math.floor(t / d + 1e-9) + 1) * d  # the next wave ends
    return Burst(claims, releases, t, starts(share, w, d), cpu)


def model(f: Fleet, c: Costs) -> dict[str, Figure]:
    r, n, p, o = f.replicas, f.jobs, f.period, c.other
    counts = shares(r, n) if r * n <= 2_000_000 else [round(n / r)] * r
    stretch, demand = 1.0, 0.0
    for _ in range(4):  # the replicas' loops share the server's cores: a fixed point
        runs = {share: burst(f, c, share, stretch) for share in set(counts)}
        typical = runs[sorted(counts)[len(counts) // 2]]
        busy = sum(c.cpu_s("claim_taken", runs[k].claims - 1, n - min(k, n)) for k in counts)
        busy += c.cpu_s("release", sum(runs[k].releases for k in counts), n)
        ratio = busy / f.server_cores / max(typical.storm_s, 1e-9)
        demand = demand or ratio  # at an idle server's pace: server CPU wanted / cores
        stretch = max(1.0, ratio * stretch)
    out: dict[str, Figure] = {}

    def put(key: str, value: float, unit: str, how: str) -> None:
        out[key] = Figure(value, unit, how)

    # Statements, per instant and per second.
    claims = sum(runs[share].claims for share in counts)
    releases = sum(runs[share].releases for share in counts)
    heartbeats, janitor = r * p / f.heartbeat_s, 2 * r * p / f.janitor_s
    room = f.workers + claim_margin(f.workers, f.claim_rtt, f.task_s)
    put("room", room, "runs", "workers + claim_margin: what a replica claims at once")
    put("claims_per_replica_burst", typical.claims, "stmts", "one replica, one instant")
    put("replica_cpu_ms", typical.cpu_s * 1e3, "CPU ms", "one replica, one instant")
    put("stretch", stretch, "x", f"statements' time in the burst, {f.server_cores} server cores")
    put("claim_statements_per_s", claims / p, "/s", "R x (1 ahead + chunks of the room)")
    put("release_statements_per_s", releases / p, "/s", "R x batches of what ended meanwhile")
    put("heartbeats_per_s", heartbeats / p, "/s", "R / 5 s")
    put("janitor_statements_per_s", janitor / p, "/s", "R x 2 / 60 s")
    put("statements_per_s", (claims + releases + heartbeats + janitor) / p, "/s", "all of them")
    put("claims_per_s", n / p, "ticks/s", "one winning insert per tick")
    put("tries_per_s", r * n / p, "ticks/s", "every replica tries every tick")
    put("conflicts_per_tick", r - 1, "/tick", "R - 1 inserts find the row there")
    # Server CPU.
    storm_cpu = c.cpu_s("claim_taken", claims - r, (r - 1) * n)
    rows_per_job = f.retention_days * 86400 / p
    prune_row = prune_s_per_row(o, n, rows_per_job)
    due = n / p * f.janitor_s / r if f.pruning else 0.0  # rows past retention, per pass
    prune_rows = min(f.prune_batch, due)
    passes = r * p / f.janitor_s
    house = heartbeats * o["heartbeat_ms"] / 1e3
    house += passes * (o["abandon_stale_ms"] / 1e3 + prune_rows * prune_row)
    cpu = c.cpu_s("claim_won", r, n) + storm_cpu + c.cpu_s("release", releases, n) + house
    put("server_cpu_per_instant_s", cpu, "CPU s", "claims, releases, housekeeping, per period")
    put("server_cores", cpu / p, "cores", "on average")
    put("storm_cpu_s", storm_cpu, "CPU s", "tries of taken ticks, after each instant")
    put("storm_s", typical.storm_s, "s", "a replica's statements for an instant, end to end")
    ahead = sum(min(share, room) for share in counts)
    ahead_cpu = c.cpu_s("claim_won", r, ahead)
    ahead_done = max(c.rtt_s("claim_won", ahead / r), ahead_cpu / f.server_cores)
    slowest = max(ahead_done, typical.storm_s / max(1, typical.claims - 1))
    lead = min(LEAD_MAX, max(0.005, 2 * slowest))
    put("lead_ms", lead * 1e3, "ms", "claims go ahead by 2 x the slowest recent claim")
    put("ahead_cpu_ms", ahead_cpu * 1e3, "CPU ms", "all replicas' claims ahead of an instant")
    put("ahead_done_ms", ahead_done * 1e3, "ms", f"their wall time, on {f.server_cores} cores")
    # Runs.
    pooled = sorted(t for share in counts for t in runs[share].starts)
    put("lateness_p50_ms", pooled[len(pooled) // 2] * 1e3, "ms", "waiting for a thread only")
    put("lateness_p99_ms", pooled[math.ceil(0.99 * len(pooled)) - 1] * 1e3, "ms", "")
    put("share_max", max(counts) / n, "", "of the runs: the largest rendezvous share")
    put("share_min", min(counts) / n, "", "the smallest")
    put("peak_locks", ahead, "locks", "ticks claimed ahead, each with its job's lock")
    slots = f.max_locks_per_transaction * (f.max_connections + f.other_backends)
    put(
        "lock_slots",
        slots * o["lock_slack"],
        "locks",
        f"locks per transaction x backends x {o['lock_slack']:.2f} (measured)",
    )
    put("connections", r, "sessions", "one lock session per replica, +1 probe at connect")
    put("connection_slots", f.max_connections - 3, "sessions", "max_connections - reserved")
    # WAL and the ledger.
    wal = c.wal("claim_won", r, n) + c.wal("claim_taken", claims - r, (r - 1) * n)
    wal += c.wal("release", releases, n) + passes * prune_rows * o["prune_wal_per_row"]
    tick_key = o["indexes"]["tick_key"]
    fpi_job = max(o["fpi_bytes_per_job"], PAGE * min(1.0, rows_per_job * tick_key / PAGE))
    fpi = fpi_job * n / f.checkpoint_s if p <= f.checkpoint_s else 0.0
    put("wal_kb_per_s", (wal / p + fpi) / 1e3, "kB/s", "rows, and full-page images")
    put("wal_rows_kb_per_s", wal / p / 1e3, "kB/s", "of which rows and statements")
    put("fpi_kb_per_s", fpi / 1e3, "kB/s", "and full-page images: a job's pages a checkpoint")
    put("wal_gb_per_day", (wal / p + fpi) * 86400 / 1e9, "GB/day", "")
    rows_day = n * 86400 / p
    kept = rows_day * f.retention_days
    put("rows_per_day", rows_day, "rows", "")
    put("rows_kept", kept, "rows", f"{f.retention_days:g} days of retention")
    put(
        "heap_gb",
        kept * o["heap_live"] * (1 + f.vacuum_scale_factor) / 1e9,
        "GB",
        "live rows, and dead ones until autovacuum",
    )
    put("heap_gb_written", kept * o["heap_written"] / 1e9, "GB", "as written")
    for name, size in sorted(o["indexes"].items()):
        put(f"index_{name}_gb", kept * size / 1e9, "GB", "")
    total = kept * (o["heap_written"] + sum(o["indexes"].values())) / 1e9
    put("ledger_gb", total, "GB", "table and indexes as written")
    # Retention.
    put("prune_rows_per_pass", prune_rows, "rows", f"N/P x 60 s / R, at most {f.prune_batch}")
    put("prune_passes_per_min", passes * 60 / p, "/min", "one per replica a minute")
    put("prune_capacity", r * f.prune_batch / f.janitor_s / (n / p), "x", "deletable / due")
    put("prune_row_ms", prune_row * 1e3, "ms", f"{rows_per_job:,.0f} rows per job kept")
    put("prune_pass_s", prune_rows * prune_row, "s", "a pass at steady state")
    deadline = f"deadline {f.statement_timeout_s:g} s"
    put("prune_full_pass_s", f.prune_batch * prune_row, "s", f"catching up; {deadline}")
    dead_per_day = 2 * rows_day  # each row's outcome update, and its delete
    put(
        "autovacuum_days",
        f.vacuum_scale_factor * kept / dead_per_day,
        "days",
        "between autovacuums of the ledger",
    )
    # What gives way: demand over what there is.
    put("use_locks", ahead / (slots * o["lock_slack"]), "", "peak locks / lock table")
    put("use_connections", (r + 1) / (f.max_connections - 3), "", "sessions / slots")
    put("use_cpu", cpu / (f.server_cores * p), "", "server CPU / cores, over a period")
    put("use_burst_cpu", demand, "", "the same in the burst, at an idle server's pace")
    put("use_lead", ahead_done / LEAD_MAX, "", "claims ahead / the longest lead, 100 ms")
    put("use_retention", (n / p) / (r * f.prune_batch / f.janitor_s), "", "deletes due / possible")
    put(
        "use_prune_deadline",
        f.prune_batch * prune_row / f.statement_timeout_s,
        "",
        "a catching-up pass / its deadline",
    )
    return out


PAGE = 8192
LEAD_MAX = 0.1  # PostgresBackend.claims_ahead
SECTIONS = {
    "statements": (
        "room",
        "claims_per_replica_burst",
        "replica_cpu_ms",
        "stretch",
        "statements_per_s",
        "claim_statements_per_s",
        "release_statements_per_s",
        "heartbeats_per_s",
        "janitor_statements_per_s",
        "claims_per_s",
        "tries_per_s",
        "conflicts_per_tick",
    ),
    "server": (
        "server_cpu_per_instant_s",
        "server_cores",
        "storm_cpu_s",
        "storm_s",
        "lead_ms",
        "ahead_cpu_ms",
        "ahead_done_ms",
    ),
    "runs, locks, connections": (
        "lateness_p50_ms",
        "lateness_p99_ms",
        "share_max",
        "share_min",
        "peak_locks",
        "lock_slots",
        "connections",
        "connection_slots",
    ),
    "WAL and the ledger": (
        "wal_kb_per_s",
        "wal_rows_kb_per_s",
        "fpi_kb_per_s",
        "wal_gb_per_day",
        "rows_per_day",
        "rows_kept",
        "heap_gb",
        "heap_gb_written",
        "index_tick_key_gb",
        "index_pkey_gb",
        "index_open_idx_gb",
        "index_claimed_at_idx_gb",
        "ledger_gb",
    ),
    "retention": (
        "prune_rows_per_pass",
        "prune_passes_per_min",
        "prune_capacity",
        "prune_row_ms",
        "prune_pass_s",
        "prune_full_pass_s",
        "autovacuum_days",
    ),
    "what gives way (demand / capacity)": (
        "use_locks",
        "use_connections",
        "use_cpu",
        "use_burst_cpu",
        "use_lead",
        "use_retention",
        "use_prune_deadline",
    ),
}


def inputs(f: Fleet, c: Costs) -> list[str]:
    """What the figures come from: stated, and measured (MEASURED or --inputs)."""
    o = c.other
    stated = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in vars(f).items()
    )
    lines = [
        "inputs",
        *textwrap.wrap(f"stated: {stated}", 96, initial_indent="  ", subsequent_indent="    "),
    ]
    lines.append(
        "  measured     server us  +us/tick  WAL B/tick  trip ms  +us/tick  client us  +us/tick"
    )
    for kind in KINDS:
        k = getattr(c, kind)
        lines.append(
            f"  {kind:<11}{k['cpu'][0]:>11.0f}{k['cpu'][1]:>10.1f}{k['wal'][1]:>12.0f}"
            f"{k['rtt'][0]:>9.2f}{k['rtt'][1]:>10.1f}{k['client'][0]:>11.0f}{k['client'][1]:>10.1f}"
        )
    index = sum(o["indexes"].values())
    lines.append(
        f"  measured row: table {o['heap_written']:.1f} B as written ({o['heap_live']:.0f} live),"
        f" indexes {index:.1f} B; full-page images {o['fpi_bytes_per_job']:.0f} B/job"
    )
    lines.append(
        f"  measured prune: {o['prune_by_pkey'] * 1e9:.0f} ns/row per job or "
        f"{o['prune_by_tick_key'] * 1e9:.0f} ns/row per row of the job, "
        f"{o['prune_wal_per_row']:.0f} WAL B/row; lock table x {o['lock_slack']:.2f}"
    )
    return lines


def render(f: Fleet, c: Costs, figures: dict[str, Figure]) -> str:
    lines = [
        f"{f.replicas} replicas x {f.jobs:,} jobs every {f.period:g} s, {f.task_s * 1e3:g} ms "
        f"runs on {f.workers} threads each",
        *inputs(f, c),
    ]
    for section, keys in SECTIONS.items():
        lines.append(section)
        for key in keys:
            if key in figures:
                v = figures[key]
                digits = 0 if abs(v.value) >= 100 else 2 if abs(v.value) < 10 else 1
                lines.append(f"  {key:<26}{v.value:>16,.{digits}f} {v.unit:<9} {v.how}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    defaults = Fleet()
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--period", type=float, default=defaults.period)
    parser.add_argument("--task-ms", type=float, default=defaults.task_s * 1000)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--claim-rtt-ms", type=float, default=defaults.claim_rtt * 1000)
    parser.add_argument("--cores", type=int, default=defaults.server_cores)
    parser.add_argument("--inputs", type=Path, help="pg_ledger.py --out's JSON")
    args = parser.parse_args(argv)
    fleet = Fleet(
        replicas=args.replicas,
        jobs=args.jobs,
        period=args.period,
        task_s=args.task_ms / 1000,
        workers=args.workers,
        claim_rtt=args.claim_rtt_ms / 1000,
        server_cores=args.cores,
    )
    measured = costs(args.inputs)
    print(render(fleet, measured, model(fleet, measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
