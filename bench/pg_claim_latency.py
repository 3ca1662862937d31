"""One claim's latency in each coordination mode, side by side on one server: the ticks of one
instant (1, 600 or 2,000 jobs) claimed by their first replica (every tick won) and then by a
peer (every tick already has a row: taken), advisory and lease taking turns instant by
instant; p50 and p99 of each, and lease / advisory from the same run.

    .venv/bin/python bench/pg_claim_latency.py  # a throwaway cluster, 40 instants per size
    .venv/bin/python bench/pg_claim_latency.py --dsn postgresql://postgres@127.0.0.1/test
    .venv/bin/python bench/pg_claim_latency.py --instants 100 --sizes 1 600 2000

By default it starts a throwaway cluster as bench/pg_scale.py does and removes it at the end;
each mode has a database of its own. Two backends per mode, ``a`` and ``b``, in this process
(``PostgresBackend(url, coordination=...)``, housekeeping idle: ``heartbeat_interval=3600``),
each seeing the other as a peer. At each instant ``a`` claims every job's tick (each wanting
the job's lock, as a job with the default ``overlap="skip"``), then ``b`` claims the same
ticks, then ``a`` releases its runs (not measured). Measured: ``PostgresBackend.claim`` as
the engine calls it, from the call to its return (the statements it sends, their round trips
and the reading of the answer), and the statements each claim sent. The ticks are long due,
so no claim is refused as early. The first instants of each size are left out (warm-up).
A ratio, never an absolute time, is what to compare across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from _pg_scale_server import (
    Server,
    create_database,
    drop_database,
    progress,
    start_cluster,
    tear_down,
    use_server,
)

from replicron.backends import ClaimRequest, Release, RunRecord
from replicron.backends.base import ClaimStatus
from replicron.events import Outcome
from replicron.postgres import PostgresBackend, migrate

MODES = ("advisory", "lease")
ROLES = ("won", "taken")
WARMUP = 3
#: Long due: every claim is answered at once, never "early".
BASE = datetime(2024, 1, 1, tzinfo=UTC)

#: (mode, ticks per instant, role) -> claim seconds; and the statements each claim sent.
Samples = dict[tuple[str, int, str], list[float]]


def quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[max(1, math.ceil(q * len(ordered))) - 1] if ordered else math.nan


class Counted:
    """A backend whose statements are counted (by wrapping its ``_statements.fetch``)."""

    def __init__(self, backend: PostgresBackend) -> None:
        self.backend = backend
        self.sent = 0
        fetch = backend._statements.fetch

        async def counting(name: str, **params: Any) -> list[Any]:
            self.sent += 1
            return await fetch(name, **params)

        backend._statements.fetch = counting  # type: ignore[method-assign]


async def opened(url: str, mode: str, replica: str) -> Counted:
    backend = PostgresBackend(url, migrate=False, heartbeat_interval=3600, coordination=mode)  # type: ignore[arg-type]
    await backend.open(replica)
    return Counted(backend)


async def instant(
    pair: tuple[Counted, Counted], jobs: Sequence[str], tick: datetime
) -> tuple[float, float, int, int]:
    """One instant in one mode: (a's claim s, b's claim s, a's statements, b's statements)."""
    a, b = pair
    requests = [ClaimRequest(job, tick, True) for job in jobs]
    timed = []
    for claimant, expect in ((a, ClaimStatus.CLAIMED), (b, ClaimStatus.TAKEN)):
        claimant.sent = 0
        began = time.perf_counter()
        claims = await claimant.backend.claim(requests)
        timed.append((time.perf_counter() - began, claimant.sent))
        wrong = [c for c in claims if c.status is not expect]
        if wrong:
            raise SystemExit(f"expected every tick {expect.name}, got {wrong[0]}")
        if claimant is a:
            won = claims
    await a.backend.release(
        [
            Release(
                RunRecord(
                    c.job, c.scheduled_at, Outcome.SUCCEEDED, "a", c.run_id, None, None, None
                ),
                c.locked,
            )
            for c in won
        ]
    )
    (won_s, won_sent), (taken_s, taken_sent) = timed
    return won_s, taken_s, won_sent, taken_sent


async def measure(
    urls: dict[str, str], sizes: Sequence[int], instants: int
) -> tuple[Samples, Samples]:
    pairs = {}
    for mode in MODES:
        a = await opened(urls[mode], mode, "a")
        b = await opened(urls[mode], mode, "b")
        await a.backend._housekeeper.heartbeat()  # each sees the other as a peer
        pairs[mode] = (a, b)
    seconds: Samples = defaultdict(list)
    sent: Samples = defaultdict(list)
    try:
        minute = 0
        for size in sizes:
            jobs = [f"job-{size}-{n:04d}" for n in range(size)]
            progress(f"{size} ticks per instant: {WARMUP} + {instants} instants per mode")
            for k in range(WARMUP + instants):
                minute += 1
                tick = BASE + timedelta(minutes=minute)
                # Taking turns, and each mode first every other instant: the machine's drift
                # falls on both.
                for mode in MODES if k % 2 == 0 else tuple(reversed(MODES)):
                    won_s, taken_s, won_sent, taken_sent = await instant(pairs[mode], jobs, tick)
                    if k < WARMUP:
                        continue
                    seconds[mode, size, "won"].append(won_s)
                    seconds[mode, size, "taken"].append(taken_s)
                    sent[mode, size, "won"].append(won_sent)
                    sent[mode, size, "taken"].append(taken_sent)
    finally:
        for a, b in pairs.values():
            await b.backend.close()
            await a.backend.close()
    return seconds, sent


def render(
    seconds: Samples, sent: Samples, sizes: Sequence[int], instants: int, server: str
) -> str:
    lines = [
        f"one claim, ms: p50 / p99 of {instants} instants per row; PostgreSQL {server}",
        f"{'ticks':>6} {'claim':<6}{'advisory':>18}{'lease':>18}{'lease/advisory':>17}"
        f"{'statements':>13}",
        f"{'':>6} {'':<6}{'p50 / p99':>18}{'p50 / p99':>18}{'p50 / p99':>17}{'adv / lease':>13}",
    ]
    for size in sizes:
        for role in ROLES:
            figures = {}
            for mode in MODES:
                ordered = sorted(seconds[mode, size, role])
                figures[mode] = (quantile(ordered, 0.5) * 1e3, quantile(ordered, 0.99) * 1e3)
            adv, lease = figures["advisory"], figures["lease"]
            statements = [
                sum(sent[mode, size, role]) / max(1, len(sent[mode, size, role])) for mode in MODES
            ]
            lines.append(
                f"{size:>6} {role:<6}"
                f"{f'{adv[0]:.2f} / {adv[1]:.2f}':>18}"
                f"{f'{lease[0]:.2f} / {lease[1]:.2f}':>18}"
                f"{f'{lease[0] / adv[0]:.2f} / {lease[1] / adv[1]:.2f}':>17}"
                f"{f'{statements[0]:g} / {statements[1]:g}':>13}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", help="use this server, not a throwaway cluster")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 600, 2000])
    parser.add_argument("--instants", type=int, default=40, help="measured per size and mode")
    args = parser.parse_args(argv)
    server: Server | None = None
    began = time.monotonic()
    try:
        server = use_server(args.dsn) if args.dsn else start_cluster()
        urls = {}
        for mode in MODES:
            db = f"pgclaim_{mode}_{uuid.uuid4().hex[:8]}"
            create_database(server, db)
            urls[mode] = server.url(db)
            asyncio.run(migrate(urls[mode]))
        with server.connect(server.admin_db) as conn:
            row = conn.execute("SELECT current_setting('server_version')").fetchone()
        version = str(row[0]).split(" ")[0] if row else "?"
        seconds, sent = asyncio.run(measure(urls, args.sizes, args.instants))
        for mode in MODES:
            drop_database(server, urls[mode].rsplit("/", 1)[1])
    except KeyboardInterrupt:
        return 130
    finally:
        tear_down(server, None)
    progress(f"took {time.monotonic() - began:.0f} s")
    print(render(seconds, sent, args.sizes, args.instants, version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
