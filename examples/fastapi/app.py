"""A FastAPI service whose scheduled jobs run once per tick across all its replicas.

    pip install 'replicron[postgres]' fastapi uvicorn
    DATABASE_URL=postgresql://app@db/app uvicorn examples.fastapi.app:app --port 8000

Start it in three pods (or on three ports) against one database: each tick of
``refresh-rates`` runs on exactly one of them. Without ``DATABASE_URL`` the processes of one
host coordinate through a state directory instead, so ``uvicorn --workers 3`` runs each tick
once too. ``/jobs`` is the cluster's status page, ``/healthz`` says whether this replica can
coordinate.

A tick runs in one process only, so what a job computes must go where every process reads
it, never into a module variable (the other workers would never see it): here a JSON file
in the state directory, replaced atomically. Across hosts, keep it in your database.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Response

import replicron
from replicron.backends.base import SharedCoordination
from replicron.web import status_app

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
log = logging.getLogger("example")


STATE_DIR = Path(os.environ.get("REPLICRON_STATE_DIR", ".replicron"))
#: What refresh-rates computed, for every worker to read.
RATES = STATE_DIR / "rates.json"


def _backend() -> replicron.Backend:
    url = os.environ.get("DATABASE_URL")
    if url:
        from replicron.postgres import PostgresBackend  # replicron[postgres]

        return PostgresBackend(url)
    return replicron.EmbeddedBackend(STATE_DIR)


backend = _backend()
scheduler = replicron.AsyncScheduler(backend=backend, stop_timeout=10)


@scheduler.job(replicron.every(seconds=2), name="refresh-rates")
async def refresh_rates() -> None:
    run = replicron.current_run()
    # The tick is the same on every replica: a natural idempotency key for writes.
    rates = {"EUR": 1.0 + run.scheduled_at.second / 1000}
    RATES.parent.mkdir(parents=True, exist_ok=True)
    fresh = RATES.with_name(f"{RATES.name}.{os.getpid()}")
    fresh.write_text(json.dumps(rates))
    fresh.replace(RATES)  # atomic: a reader sees the old rates or the new, never half
    log.info("refresh-rates tick %s run %s", run.scheduled_at.isoformat(), run.run_id)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with scheduler:  # started with the app, stopped (runs finished) with it
        yield


app = FastAPI(lifespan=lifespan)
app.mount("/jobs", status_app(scheduler))


@app.get("/rates")
async def get_rates() -> dict[str, float]:
    try:
        rates: dict[str, float] = json.loads(RATES.read_text())
    except FileNotFoundError:  # before the first run
        return {}
    return rates


@app.get("/healthz")
async def healthz(response: Response) -> dict[str, bool]:
    connected = isinstance(backend, SharedCoordination) and backend.connected
    response.status_code = 200 if connected else 503
    return {"connected": connected}
