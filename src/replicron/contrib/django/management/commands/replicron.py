"""``manage.py replicron run|check|status|pause|resume|run-now``: the project's scheduler as
a process of its own, its checks, and the cluster as ``replicron status`` shows it."""

from __future__ import annotations

import logging
import sys
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from replicron.backends.base import ClusterRegistry
from replicron.cli import run_cluster_command
from replicron.contrib.django.conf import make_backend, read_settings
from replicron.contrib.django.declare import build_scheduler
from replicron.contrib.django.runtime import run_until_signalled
from replicron.dsn import mask_dsn
from replicron.triggers import WallClockTrigger

__all__ = ["Command"]


class Command(BaseCommand):
    help = (
        "Run the project's scheduled jobs as one replica (run), check them (check), or show "
        "and steer the cluster: status, pause JOB, resume JOB, run-now JOB."
    )
    requires_system_checks: ClassVar[list[str]] = []  # `check` runs them itself, `run` at start

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        commands.add_parser("run", help="run the jobs until SIGTERM/SIGINT (a graceful stop)")
        check = commands.add_parser("check", help="check the settings and every job")
        check.add_argument("-n", type=int, default=3, help="fire times per job (default 3)")
        status = commands.add_parser("status", help="each job's last run, next tick, problems")
        status.add_argument("--json", action="store_true", help="print it as JSON")
        status.add_argument("--check", action="store_true", help="exit 1 with one line per problem")
        status.add_argument(
            "--departed", action="store_true", help="list the departed replicas too"
        )
        for name, text in (
            ("pause", "pause a job on every replica"),
            ("resume", "resume a paused job"),
            ("run-now", "run a job once now, on whichever replica sees it first"),
        ):
            command = commands.add_parser(name, help=text)
            command.add_argument("job", help="the job's name")
            if name == "pause":
                command.add_argument(
                    "--force",
                    action="store_true",
                    help="pause it though no replica has registered it (a job not deployed yet)",
                )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            settings = read_settings()
            if action == "run":
                self._run(settings)
            elif action == "check":
                self._check(settings, options["n"])
            else:
                self._cluster(settings, action, options)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def _run(self, settings: Any) -> None:
        self.check(tags=["replicron"])
        replicron_logger = logging.getLogger("replicron")
        if not replicron_logger.handlers and not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO,
                stream=sys.stderr,
                format="%(asctime)s %(levelname)s %(name)s %(message)s",
            )
        # The process is the scheduler's own: it may hold the collector back during bursts.
        scheduler = build_scheduler(settings, **{"defer_gc": True, **settings.scheduler})
        try:
            code = run_until_signalled(scheduler)
        except Exception as exc:  # as the daemon: one line, then leave restarts to the platform
            message = mask_dsn(" ".join(str(exc).split()))
            raise CommandError(f"cannot start: {message}", returncode=1) from None
        sys.exit(code)

    def _check(self, settings: Any, count: int) -> None:
        scheduler = build_scheduler(settings)
        for job in scheduler.jobs():
            trigger = job.trigger
            # In the job's own zone, as the daemon's check prints them: a Europe/Berlin job
            # fires at 03:00+01:00, not at 02:00+00:00.
            zone = (
                trigger.zone
                if isinstance(trigger, WallClockTrigger)
                else ZoneInfo(settings.timezone)
            )
            self.stdout.write(f"{job.name}: {trigger}")
            for instant in job.next_runs(count):
                self.stdout.write(f"    {instant.astimezone(zone).isoformat()}")
        self.stdout.write(f"OK: {len(scheduler.jobs())} jobs, backend {settings.backend}")

    def _cluster(self, settings: Any, action: str, options: dict[str, Any]) -> None:
        backend = make_backend(settings, migrate=False)
        if not isinstance(backend, ClusterRegistry):
            raise CommandError(
                f"the {settings.backend} backend is one process's: it has no cluster to show"
            )
        where = (
            f"DATABASES[{settings.database!r}]"
            if settings.backend == "postgres"
            else str(settings.state_dir)
        )
        argv = [action]
        if action == "status":
            argv += ["--json"] * options["json"] + ["--check"] * options["check"]
            argv += ["--departed"] * options["departed"]
        else:
            argv += [options["job"]] + ["--force"] * options.get("force", False)
        code = run_cluster_command(argv, backend, where, migrate_with="manage.py migrate")
        if code:
            sys.exit(code)
