"""One replica for the metrics acceptance test: a Scheduler on a PostgresBackend whose job
succeeds or fails as a flag file says, measured by a ReplicronCollector and served over HTTP.

Run as ``python -m tests.acceptance.metrics_replica --dsn DSN --replica-id r1 ...`` from the
repository root. The job fails while the flag file reads ``fail`` and succeeds otherwise. The
metrics are served on ``http://127.0.0.1:PORT/metrics``, on a free port written to
``--port-file`` once the scheduler runs. SIGTERM stops the scheduler and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from replicron import Scheduler, every
from replicron.metrics import ReplicronCollector
from replicron.postgres import PostgresBackend
from tests.acceptance._runner import set_up_replica_process

logger = logging.getLogger("replicron.acceptance")


def flagged_job(flag_file: Path) -> Callable[[], None]:
    def job() -> None:
        if flag_file.read_text().strip() == "fail":
            raise RuntimeError("the flag file says fail")

    return job


def write_atomically(path: Path, text: str) -> None:
    """Readers see the whole text or no file (never a half-written port)."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    os.replace(partial, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--job", required=True, help="the job's name")
    parser.add_argument("--every-s", type=float, default=1.0, help="the job's interval")
    parser.add_argument("--flag-file", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--cluster-every", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=120.0, help="exit after this long")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = set_up_replica_process(args.replica_id)
    backend = PostgresBackend(args.dsn, heartbeat_interval=0.5, stale_after=1.5)
    scheduler = Scheduler(backend=backend, replica_id=args.replica_id)
    scheduler.add_job(every(seconds=args.every_s), flagged_job(args.flag_file), name=args.job)
    collector = ReplicronCollector(scheduler, cluster_every=args.cluster_every)
    registry = CollectorRegistry()
    registry.register(collector)
    server, server_thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    scheduler.start()
    write_atomically(args.port_file, str(server.server_port))
    logger.info("ready; metrics on port %s", server.server_port)
    if not stop.wait(args.seconds):
        logger.warning("no SIGTERM within %s s; stopping", args.seconds)
    scheduler.shutdown(timeout=5)
    collector.close()
    server.shutdown()
    server_thread.join(5)
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
