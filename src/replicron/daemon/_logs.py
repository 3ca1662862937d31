"""The daemon's log lines on stderr: text for people, or one JSON object per line for log
collectors. Every line names the replica; a job's lines name the job and tick."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["setup_logging"]

_FIELDS = ("event", "job", "tick", "run_id", "replica")


def _traceback_wanted(record: logging.LogRecord) -> bool:
    """A command's non-zero exit is told in full by its message: a traceback through the
    daemon's own code would only hide it."""
    from .command import CommandFailed

    return bool(record.exc_info) and not isinstance(record.exc_info[1], CommandFailed)  # type: ignore[index]


class _TextFormatter(logging.Formatter):
    def __init__(self, replica: str) -> None:
        super().__init__()
        self.replica = replica

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        line = f"{stamp}Z {record.levelname:<7} [{self.replica}] {record.getMessage()}"
        if _traceback_wanted(record):
            line += "\n" + self.formatException(record.exc_info)  # type: ignore[arg-type]
        return line


class _JsonFormatter(logging.Formatter):
    def __init__(self, replica: str) -> None:
        super().__init__()
        self.replica = replica

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "replica": self.replica,
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if _traceback_wanted(record):
            entry["traceback"] = self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(entry, default=str)


def setup_logging(level: str, form: str, replica: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter(replica) if form == "json" else _TextFormatter(replica))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # other libraries: warnings and up
    logging.getLogger("replicron").setLevel(level)
