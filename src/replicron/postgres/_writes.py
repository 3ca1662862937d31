"""What the backend says about outcome writes that did not simply record a first outcome."""

from __future__ import annotations

import logging

from replicron.backends.base import RunRecord

__all__ = ["log_unwritten", "log_write"]

logger = logging.getLogger(__name__)


def _extra(record: RunRecord, replica: str) -> dict[str, str]:
    return {"event": "lock_error", "job": record.job, "tick": record.scheduled_at.isoformat(),
            "replica": replica}  # fmt: skip


def log_write(record: RunRecord, written: bool, before: str | None, replica: str) -> None:
    """Say what an outcome write did when it was not simply the first outcome of its row."""
    extra = _extra(record, replica)
    outcome = record.outcome.value
    if written and before == "abandoned" and outcome != "abandoned":
        logger.warning(
            "job %r tick %s: replaced %r (written by a janitor while the run went on) with %r",
            record.job, record.scheduled_at.isoformat(), before, outcome, extra=extra,
        )  # fmt: skip
    elif not written:
        logger.error(
            "job %r tick %s: outcome %r not written: %s", record.job,
            record.scheduled_at.isoformat(), outcome,
            "no row of this replica" if before is None else f"the row already says {before!r}",
            extra=extra,
        )  # fmt: skip


def log_unwritten(record: RunRecord, replica: str) -> None:
    """At shutdown, an outcome that could not be written: said at ERROR with its tick."""
    logger.error(
        "job %r tick %s: could not record %s (run %s): the database is unreachable; the row "
        "goes stale and a janitor records it abandoned", record.job,
        record.scheduled_at.isoformat(), record.outcome.value, record.run_id,
        extra=_extra(record, replica),
    )  # fmt: skip
