"""What the replica runner processes (``replica.py``, ``embedded_replica.py``) share."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

__all__ = ["set_up_replica_process"]


def set_up_replica_process(replica_id: str) -> threading.Event:
    """Log to stderr with the replica in every line (replicron's own records at DEBUG), and
    return an event that SIGTERM sets: the signal to shut the scheduler down."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {replica_id} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("replicron").setLevel(logging.DEBUG)
    stop = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    return stop
