"""What can be wrong with a job: the kinds of problem, how bad each is, and the value that
carries one (public as ``replicron.cluster.Problem``, ``ProblemKind`` and ``Severity``), and
the words for a job's state (``replicron.cluster.JobState``).

Which problems a job has, and their words, is decided in one place,
:meth:`replicron.cluster.ClusterStatus.job_problems`; ``replicron status`` (its notes and
``--check``), the status page, ``ClusterStatus.problems`` and the JSON's ``problems`` all
render its answer, and none of them decides again what counts. Likewise a job's states are
decided by :meth:`replicron.cluster.ClusterStatus.job_states` alone, and ``replicron status``,
the status page and the Django admin print its words.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

__all__ = ["JobState", "Problem", "ProblemKind", "Severity", "how_long"]


class Severity(enum.StrEnum):
    """How bad a :class:`Problem` is."""

    #: The job's runs go wrong or cannot start: a failed run, a run blocking the job's lock.
    ERROR = "error"
    #: The job's schedule is off: a tick nobody ran, replicas that run different schedules.
    WARNING = "warning"


class ProblemKind(enum.StrEnum):
    """What is wrong with a job."""

    #: An expected tick has no row though its grace has passed.
    OVERDUE = "overdue"
    #: Live replicas disagree on the job's definition: the cluster runs both schedules.
    DRIFT = "drift"
    #: The last run failed, timed out or was cut off (``JobView.last_outcome`` says which).
    LAST_RUN_FAILED = "last_run_failed"
    #: A run of a frozen or cut-off replica may still hold the job's lock.
    BLOCKED = "blocked"

    @property
    def severity(self) -> Severity:
        return _SEVERITY[self]


_SEVERITY = {
    ProblemKind.OVERDUE: Severity.WARNING,
    ProblemKind.DRIFT: Severity.WARNING,
    ProblemKind.LAST_RUN_FAILED: Severity.ERROR,
    ProblemKind.BLOCKED: Severity.ERROR,
}


class JobState(enum.StrEnum):
    """A job's state in one word, the same wherever it is shown. Problems are in capitals;
    a job may be in several states at once (``OVERDUE`` and ``unscheduled``, say)."""

    #: An expected tick has no row though its grace has passed.
    OVERDUE = "OVERDUE"
    #: The last run failed.
    FAILED = "FAILED"
    #: The last run overran its timeout.
    TIMED_OUT = "TIMED OUT"
    #: The last run was cut off: its replica died or lost its lock.
    ABANDONED = "ABANDONED"
    #: Live replicas disagree on the job's definition.
    DRIFT = "DRIFT"
    #: A run of a frozen or cut-off replica may hold the job's lock.
    BLOCKED = "BLOCKED"
    RUNNING = "running"
    PAUSED = "paused"
    #: No live replica schedules it while some replica is alive.
    UNSCHEDULED = "unscheduled"
    #: No replica, live or gone, has it in the registry: its runs are history.
    UNREGISTERED = "unregistered"
    #: Nothing to say: the job has no run recorded yet.
    NO_RUNS_YET = "no runs yet"
    #: Nothing to say: its last tick went as it should.
    OK = "ok"

    @property
    def severity(self) -> Severity | None:
        """How bad the state is, for a problem; ``None`` for the others."""
        return _STATE_SEVERITY.get(self)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing to act on about a job."""

    job: str
    kind: ProblemKind
    #: What is wrong, for a person, without the job's name.
    text: str

    @property
    def severity(self) -> Severity:
        return self.kind.severity

    @property
    def line(self) -> str:
        """The job's name and the text: a line of ``replicron status --check``."""
        return f"{self.job}: {self.text}"


def how_long(delta: timedelta) -> str:
    """``delta`` for a person: seconds, minutes, hours or days."""
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


_STATE_SEVERITY = {
    JobState.OVERDUE: Severity.WARNING,
    JobState.DRIFT: Severity.WARNING,
    JobState.FAILED: Severity.ERROR,
    JobState.TIMED_OUT: Severity.ERROR,
    JobState.ABANDONED: Severity.ERROR,
    JobState.BLOCKED: Severity.ERROR,
}
