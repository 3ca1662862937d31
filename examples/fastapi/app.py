"""A FastAPI service whose scheduled jobs run once per tick across all its replicas.

    pip install 'replicron[postgres]' fastapi uvicorn
    DATABASE_URL=postgresql://app@db/app uvicorn examples.fastapi.app:app --port 8000

Start it in three pods (or on three ports) against one database: each tick of
``refresh-rates`` runs on exactly one of them. Without ``DATABASE_URL`` the processes of one
host coordinate through a state directory instead, so ``uvicorn --workers 3`` runs each tick
once too. ``/jobs`` is the cluster's status page, ``/healthz`` says whether this replica can
coordinate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response

import replicron
from replicron.backends.base import SharedCoordination
from replicron.web import status_app

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
log = logging.getLogger("example")


def _backend() -> replicron.Backend:
    url = os.environ.get("DATABASE_URL")
    if url:
        from replicron.postgres import PostgresBackend  # replicron[postgres]

        return PostgresBackend(url)
    return replicron.EmbeddedBackend(os.environ.get("REPLICRON_STATE_DIR", ".replicron"))


backend = _backend()
scheduler = replicron.AsyncScheduler(backend=backend, stop_timeout=10)
rates: dict[str, float] = {}


@scheduler.job(replicron.every(seconds=2), name="refresh-rates")
async def refresh_rates() -> None:
    run = replicron.current_run()
    # The tick is the same on every replica: a natural idempotency key for writes.
    rates["EUR"] = 1.0 + run.scheduled_at.second / 1000
    log.info("refresh-rates tick %s run %s", run.scheduled_at.isoformat(), run.run_id)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with scheduler:  # started with the app, stopped (runs finished) with it
        yield


app = FastAPI(lifespan=lifespan)
app.mount("/jobs", status_app(scheduler))


@app.get("/rates")
async def get_rates() -> dict[str, float]:
    return rates


@app.get("/healthz")
async def healthz(response: Response) -> dict[str, bool]:
    connected = isinstance(backend, SharedCoordination) and backend.connected
    response.status_code = 200 if connected else 503
    return {"connected": connected}
