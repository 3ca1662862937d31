"""The daemon, ``replicron run CONFIG``, as real processes: each daemon is ``python -m
replicron run`` on a TOML config of its own (its own ``replica_id``), its log (stderr) in a
file under the test's ``tmp_path``, printed at teardown (shown when the test fails).

What is checked comes from outside the daemons: the ledger (the SQLite file of the state
directory, or ``replicron_runs`` on PostgreSQL), ``replicron status --json``, what the command
jobs themselves wrote (a line per run appended with O_APPEND, or the pids of a program and its
grandchild, looked up in /proc), the daemons' logs and exit statuses, and HTTP.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._harness.daemons import Daemons as DaemonProcesses
from tests._harness.daemons import config_text
from tests._harness.processes import Child, clean_env, process_start
from tests.helpers import embedded_rows, poll_until

pytestmark = pytest.mark.timeout(60)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SCRIPTS = Path(__file__).resolve().parent / "daemon_scripts"
PROCESS_GROUP = SCRIPTS / "process_group.py"
SECOND = timedelta(seconds=1)
#: The ``summary`` fixture (tests/conftest.py): a scenario's line, printed at the end.
Summary = Callable[[str], None]


# ---- what the command jobs wrote ----------------------------------------------------


def recording(out: Path, tag: str) -> list[str]:
    """A command that appends "JOB TAG TICK REPLICA RUN_ID" to ``out`` (one write, O_APPEND)."""
    script = (
        f'echo "$REPLICRON_JOB {tag} $REPLICRON_SCHEDULED_AT $REPLICRON_REPLICA_ID '
        '$REPLICRON_RUN_ID" >> "$1"'
    )
    return ["sh", "-c", script, "record", str(out)]


@dataclass(frozen=True)
class Record:
    """A line a ``recording`` command appended: one run that really happened."""

    job: str
    tag: str
    tick: datetime
    replica: str
    run_id: int


def records(out: Path) -> list[Record]:
    if not out.exists():
        return []
    found = []
    for line in out.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            continue  # being written
        job, tag, tick, replica, run_id = line.split()
        found.append(Record(job, tag, datetime.fromisoformat(tick), replica, int(run_id)))
    return found


# ---- the ledger ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    run_id: int
    tick: datetime
    replica: str
    outcome: str | None
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None


def embedded_ledger(state_dir: Path, job: str) -> list[Row]:
    return [
        Row(
            r["run_id"],
            r["scheduled_at"],
            r["replica_id"],
            r["outcome"],
            r["error"],
            r["started_at"],
            r["finished_at"],
        )
        for r in embedded_rows(state_dir, job)
    ]


def postgres_ledger(dsn: str, namespace: str, job: str) -> list[Row]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('replicron_runs')").fetchone()
        if exists is None or exists[0] is None:
            return []
        rows = conn.execute(
            "SELECT run_id, scheduled_at, replica_id, outcome, error, started_at, finished_at"
            " FROM replicron_runs WHERE namespace = %s AND job = %s ORDER BY scheduled_at",
            (namespace, job),
        ).fetchall()
    return [Row(*row) for row in rows]


def status_json(*source: str) -> dict[str, Any]:
    """``replicron status SOURCE --json``, parsed."""
    done = subprocess.run(
        [sys.executable, "-m", "replicron", "status", *source, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# ---- processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    """A process a command job started, known by pid and start time (pids are reused)."""

    pid: int
    started: int

    @property
    def alive(self) -> bool:
        return process_start(self.pid) == self.started

    def kill(self) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def stamp(line: str) -> datetime:
    """The instant of a daemon log line."""
    return datetime.fromisoformat(line.split(" ", 1)[0])


class Daemons(DaemonProcesses):
    """The daemon processes of one test, and what their commands started."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.strays: list[Process] = []

    def processes(self, pidfile: Path, timeout: float = 20.0) -> tuple[Process, Process, Any]:
        """The program and grandchild a ``process_group.py`` run reported in ``pidfile``
        (waited for), remembered to be killed at the end whatever happens."""
        facts = self.wait_until(
            f"{pidfile.name} to be written",
            lambda: json.loads(pidfile.read_text()) if pidfile.exists() else None,
            timeout,
        )
        found = []
        for pid in (facts["pid"], facts["child"]):
            started = process_start(pid)
            assert started is not None, f"process {pid} of {facts} is not running"
            found.append(Process(pid, started))
        self.strays += found
        return found[0], found[1], facts

    def stop_all(self, timeout: float = 20.0) -> dict[str, tuple[int, float]]:
        """SIGTERM every live daemon at once; each one's exit status and seconds to exit."""
        codes = self.stop(timeout=timeout)
        return {name: (code, self[name].stop_took or 0.0) for name, code in codes.items()}

    def close(self) -> None:
        super().close()
        for process in self.strays:
            process.kill()


@pytest.fixture
def daemon_host() -> type[DaemonProcesses]:
    """The ``daemons`` fixture (conftest.py) of this module is a host with more helpers."""
    return Daemons


def stop_cleanly(daemon: Child, timeout: float = 20.0) -> float:
    """SIGTERM the daemon, which must exit 0; the seconds it took."""
    code, took = daemon.stop(timeout)
    assert code == 0, daemon.log()
    return took


def wait_dead(process: Process, what: str, timeout: float = 10.0) -> None:
    poll_until(f"{what} (pid {process.pid}) to be dead", lambda: not process.alive, timeout)


def ledger_row(read: Callable[[], list[Row]], run_id: int, outcome: str) -> Row:
    """Wait until run ``run_id`` has an outcome recorded; fail unless it is ``outcome``."""
    row = poll_until(
        f"run {run_id} to be recorded",
        lambda: next((r for r in read() if r.run_id == run_id and r.outcome), None),
        20,
    )
    assert row.outcome == outcome, row
    return row


# ---- 1, 2: three daemons, each tick once -----------------------------------------------


def backend_label(settings: Mapping[str, object]) -> str:
    if "database_url" not in settings:
        return "embedded"
    return f"PostgreSQL, {settings.get('coordination', 'advisory')} coordination"


def three_daemons_each_tick_once(
    daemons: Daemons,
    backend: dict[str, object],
    read: Callable[[], list[Row]],
    status_source: Sequence[str],
    summary: Summary,
    *,
    hand_over: bool = False,
) -> None:
    """Three daemons run a per-second job; each tick runs once, none is left out, and more
    than one replica ran some. With ``hand_over``, the replica running the ticks is stopped
    first, and the two others must go on without a gap."""
    label = f"{backend_label(backend)}{', a hand-over' if hand_over else ''}"
    out = daemons.workdir / "runs.txt"
    job = {"name": "tick", "every": "1s", "command": recording(out, "-"), "timeout": "20s"}
    names = ("r1", "r2", "r3")
    for name in names:
        settings = {**backend, "replica_id": name, "stop_timeout": "5s"}
        daemons.start(name, config_text(settings, [job]))
    for name in names:
        daemons[name].wait_log(f"started replica {name} with 1 jobs", 30)

    stopped: dict[str, tuple[int, float]] = {}
    if hand_over:
        first = daemons.wait_until("4 runs", lambda: records(out)[3:] or None, 30)[-1].replica
        stopped[first] = daemons[first].stop(timeout=20)
        handed_over = datetime.now(UTC)

        def taken_over() -> list[Record] | None:
            done = [r for r in records(out) if r.tick > handed_over]
            return done if len(done) >= 3 else None

        after = daemons.wait_until("3 runs after the hand-over", taken_over, 30)
        assert first not in {r.replica for r in after}

    def enough() -> list[Record] | None:
        done = records(out)
        return done if len(done) >= 7 and len({r.replica for r in done}) > 1 else None

    daemons.wait_until("7 runs, by more than one replica", enough, 40)
    stop_sent = datetime.now(UTC)
    stopped |= daemons.stop_all(timeout=20)
    assert {name: code for name, (code, _) in stopped.items()} == dict.fromkeys(names, 0)
    assert all(took < 15 for _, took in stopped.values()), stopped
    for name in names:
        assert daemons[name].lines("stopped"), f"{name} did not log its stop"

    ran = records(out)
    ticks = [r.tick for r in ran]
    assert ran, "no runs"
    assert {r.job for r in ran} == {"tick"}
    twice = [tick for tick, n in Counter(ticks).items() if n > 1]
    assert not twice, f"ticks run more than once: {twice}"
    ticks.sort()
    gaps = [(a, b) for a, b in itertools.pairwise(ticks) if b - a != SECOND]
    assert not gaps, f"ticks missing between {gaps}"
    by_replica = Counter(r.replica for r in ran)
    assert len(by_replica) > 1, by_replica
    assert set(by_replica) <= set(names)

    rows = read()
    succeeded = {r.tick: r for r in rows if r.outcome == "succeeded"}
    # What ran is what the ledger says succeeded, by the replica it names, tick for tick.
    assert sorted(succeeded) == ticks
    for record in ran:
        assert succeeded[record.tick].replica == record.replica, record
        assert succeeded[record.tick].run_id == record.run_id, record
    # Anything else is a tick claimed ahead and dropped at the stop: at or after it.
    others = [r for r in rows if r.outcome != "succeeded"]
    assert all(r.outcome == "missed" and r.tick >= stop_sent for r in others), others
    row_ticks = [r.tick for r in rows]
    assert len(set(row_ticks)) == len(row_ticks)

    status = status_json(*status_source)
    [view] = status["jobs"]
    assert view["job"] == "tick"
    assert datetime.fromisoformat(view["last_success_at"]) >= ticks[-1]
    assert sorted(r["replica_id"] for r in status["replicas"]) == list(names)
    assert not any(r["alive"] for r in status["replicas"]), status["replicas"]
    summary(
        f"3 daemons, {label}: {len(ticks)} ticks {ticks[0]:%H:%M:%S}..{ticks[-1]:%H:%M:%S}, "
        f"each once, by {dict(sorted(by_replica.items()))}; stopped in "
        + ", ".join(f"{took:.2f} s" for _, took in stopped.values())
    )


def test_three_daemons_on_one_state_dir_run_each_tick_once(
    daemons: Daemons, summary: Summary
) -> None:
    state_dir = daemons.workdir / "state"
    three_daemons_each_tick_once(
        daemons,
        {"state_dir": str(state_dir)},
        lambda: embedded_ledger(state_dir, "tick"),
        ["--state-dir", str(state_dir)],
        summary,
    )


@pytest.mark.parametrize("coordination", ["advisory", "lease"])
def test_three_daemons_on_postgresql_run_each_tick_once(
    daemons: Daemons, dsn: str, summary: Summary, coordination: str
) -> None:
    namespace = f"daemon-{uuid.uuid4().hex[:8]}"
    three_daemons_each_tick_once(
        daemons,
        {"database_url": dsn, "namespace": namespace, "coordination": coordination},
        lambda: postgres_ledger(dsn, namespace, "tick"),
        ["--database-url", dsn, "--namespace", namespace],
        summary,
        # On PostgreSQL a job's ticks are claimed ahead by its first replica (rendezvous
        # hashing, _engine/capacity.py): the others run them once it is gone.
        hand_over=True,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        modes = conn.execute(
            "SELECT DISTINCT coordination FROM replicron_replicas WHERE namespace = %s",
            (namespace,),
        ).fetchall()
    assert modes == [(coordination,)]  # each daemon ran in the mode its config named


# ---- 3: SIGTERM during a run ------------------------------------------------------------


def one_daemon_with_a_run(
    daemons: Daemons, *, stop_timeout: str, work_seconds: float, **job: object
) -> tuple[Child, Path, Process, Process, dict[str, Any]]:
    """A daemon whose job runs ``process_group.py`` once; returns when the run has started."""
    state_dir = daemons.workdir / "state"
    pidfile = daemons.workdir / "pids.json"
    command = [sys.executable, str(PROCESS_GROUP), str(pidfile), str(work_seconds)]
    if job.pop("ignore_term", False):
        command.append("--ignore-term")
    settings = {"state_dir": str(state_dir), "replica_id": "solo", "stop_timeout": stop_timeout}
    spec = {"name": "work", "every": "1s", "max_runs": 1, "command": command, **job}
    daemon = daemons.start("solo", config_text(settings, [spec]))
    program, grandchild, facts = daemons.processes(pidfile)
    daemon.wait_log("work[", 10)
    daemon.wait_log("stdout| started", 10)  # the daemon reads the program's output
    return daemon, state_dir, program, grandchild, facts


def test_sigterm_lets_a_run_finish_within_stop_timeout(daemons: Daemons, summary: Summary) -> None:
    daemon, state_dir, program, grandchild, facts = one_daemon_with_a_run(
        daemons, stop_timeout="15s", work_seconds=3
    )
    assert program.alive
    took = stop_cleanly(daemon, timeout=30)
    assert not program.alive
    assert not grandchild.alive
    # It waited for the run: the program said it finished, and the run was recorded so.
    assert daemon.lines("stdout| finished"), daemon.log()
    row = ledger_row(lambda: embedded_ledger(state_dir, "work"), int(facts["run_id"]), "succeeded")
    assert row.error is None
    assert row.replica == "solo"
    assert 1.5 <= took < 12, took  # the run had about 3 s to go when SIGTERM came
    assert not daemon.lines("killing its process group")
    summary(
        f"SIGTERM during a 3 s run: it finished, succeeded; the daemon exited 0 in {took:.2f} s"
    )


def test_a_kill_grace_longer_than_stop_timeout_still_lets_a_short_run_finish(
    daemons: Daemons, summary: Summary
) -> None:
    """kill_grace (10 s by default) is more than the stop gives (4 s): SIGTERM would come at
    once, cutting off a run that was about to end; it comes halfway to the deadline."""
    daemon, state_dir, program, _, facts = one_daemon_with_a_run(
        daemons, stop_timeout="4s", work_seconds=1
    )
    took = stop_cleanly(daemon, timeout=30)
    assert not program.alive
    assert daemon.lines("stdout| finished"), daemon.log()
    assert not daemon.lines("sent SIGTERM"), daemon.log()
    ledger_row(lambda: embedded_ledger(state_dir, "work"), int(facts["run_id"]), "succeeded")
    summary(
        f"SIGTERM during a 1 s run, stop_timeout 4 s, kill_grace 10 s: it finished, "
        f"succeeded; exit 0 in {took:.2f} s"
    )


def test_sigterm_stops_a_run_that_outlasts_stop_timeout(daemons: Daemons, summary: Summary) -> None:
    daemon, state_dir, program, grandchild, facts = one_daemon_with_a_run(
        daemons, stop_timeout="1s", work_seconds=60
    )
    took = stop_cleanly(daemon, timeout=30)
    wait_dead(program, "the program")
    wait_dead(grandchild, "its grandchild sleep")
    assert took < 10, took  # it gave the run stop_timeout, then did not wait for it
    # kill_grace (10 s by default) is longer than stop_timeout: SIGTERM halfway to the
    # deadline, and the program ends on it (tests/acceptance/test_daemon_stop.py times it).
    assert daemon.lines("the scheduler is stopping: sent SIGTERM"), daemon.log()
    assert not daemon.lines("stdout| finished")
    row = ledger_row(lambda: embedded_ledger(state_dir, "work"), int(facts["run_id"]), "abandoned")
    assert row.error is not None
    assert "shut down" in row.error, row
    summary(
        f"SIGTERM during a 60 s run, stop_timeout 1 s: SIGTERM, abandoned; exit 0 in {took:.2f} s"
    )


def test_a_second_sigterm_kills_the_run_at_once(daemons: Daemons, summary: Summary) -> None:
    daemon, state_dir, program, grandchild, facts = one_daemon_with_a_run(
        daemons, stop_timeout="60s", work_seconds=60
    )
    daemon.expected_dead = True
    began = time.monotonic()
    daemon.signal(signal.SIGTERM)
    daemon.wait_log("stopping: no new ticks", 10)
    assert program.alive, "the first SIGTERM lets the run go on"
    daemon.signal(signal.SIGTERM)
    code = daemon.proc.wait(20)
    took = time.monotonic() - began
    assert code == 0, daemon.log()
    assert took < 15, took  # not the 60 s stop_timeout
    wait_dead(program, "the program")
    wait_dead(grandchild, "its grandchild sleep")
    assert daemon.lines("received again: killing the runs going on now"), daemon.log()
    ledger_row(lambda: embedded_ledger(state_dir, "work"), int(facts["run_id"]), "abandoned")
    summary(f"a second SIGTERM during a 60 s stop_timeout: run killed, exit 0 in {took:.2f} s")


def test_a_daemon_killed_with_sigkill_leaves_nothing_of_its_run(
    daemons: Daemons, summary: Summary
) -> None:
    daemon, _, program, grandchild, _ = one_daemon_with_a_run(
        daemons, stop_timeout="1s", work_seconds=60
    )
    daemon.kill()
    # The kernel tells the group's guard of its parent's death, and it kills the group: the
    # program and the grandchild it started, which no signal to the program alone reaches.
    wait_dead(program, "the program")
    wait_dead(grandchild, "its grandchild sleep")
    summary("SIGKILL of the daemon during a run: the program and its grandchild died with it")


# ---- 4: SIGHUP ----------------------------------------------------------------------------


def test_sighup_applies_a_changed_config_and_rejects_an_invalid_one(
    daemons: Daemons, summary: Summary
) -> None:
    state_dir = daemons.workdir / "state"
    out = daemons.workdir / "runs.txt"
    settings = {"state_dir": str(state_dir), "replica_id": "solo", "stop_timeout": "5s"}

    def job(name: str, tag: str) -> dict[str, object]:
        return {"name": name, "every": "1s", "command": recording(out, tag)}

    daemon = daemons.start("solo", config_text(settings, [job("keep", "v1"), job("drop", "d")]))
    pid = daemon.proc.pid

    def runs(name: str, tag: str, after: datetime = EPOCH) -> list[Record]:
        return [r for r in records(out) if r.job == name and r.tag == tag and r.tick > after]

    daemons.wait_until(
        "two runs of each job",
        lambda: len(runs("keep", "v1")) >= 2 and len(runs("drop", "d")) >= 2,
        20,
    )

    # A changed job, a removed one, an added one.
    daemons.write_config("solo", config_text(settings, [job("keep", "v2"), job("new", "n")]))
    daemon.signal(signal.SIGHUP)
    [reloaded] = daemon.wait_log("reloaded:", 10)
    assert "reloaded: 2 jobs; added new, changed keep, removed drop" in reloaded, reloaded
    at = stamp(reloaded)
    daemons.wait_until(
        "two runs of the added and of the changed job after the reload",
        lambda: len(runs("new", "n", at)) >= 2 and len(runs("keep", "v2", at)) >= 2,
        20,
    )
    assert daemon.proc.pid == pid
    assert daemon.proc.poll() is None
    assert len(daemon.lines("started replica")) == 1, "the daemon restarted"
    assert not runs("drop", "d", at), "the removed job ran after the reload"
    assert not runs("keep", "v1", at), "the changed job ran its old command after the reload"
    assert {r.job for r in records(out)} == {"keep", "drop", "new"}

    # An invalid config: refused whole, with its problem, and the running one stays.
    bad = config_text(
        settings,
        [
            job("keep", "v3"),
            {"name": "bad", "every": "1s", "comand": ["true"]},
        ],
    )
    daemons.write_config("solo", bad)
    daemon.signal(signal.SIGHUP)
    [rejected] = daemon.wait_log("reload rejected", 10)
    problems = daemon.lines("job 'bad': unknown option 'comand' (did you mean 'command'?)")
    assert problems, daemon.log()
    assert all("ERROR" in line for line in [*problems, rejected])
    assert str(daemons.config_path("solo")) in problems[0]
    at = stamp(rejected)
    daemons.wait_until(
        "two runs of each job of the old config after the rejection",
        lambda: len(runs("new", "n", at)) >= 2 and len(runs("keep", "v2", at)) >= 2,
        20,
    )
    assert not runs("keep", "v3"), "the rejected config's command ran"
    assert len(daemon.lines("reloaded:")) == 1
    stop_cleanly(daemon)
    summary(f"SIGHUP: {reloaded.split('] ', 1)[1]}; then {rejected.split('] ', 1)[1]}")


# ---- 5: timeout -------------------------------------------------------------------------------


def test_a_command_that_ignores_sigterm_is_killed_kill_grace_after_its_timeout(
    daemons: Daemons, summary: Summary
) -> None:
    daemon, state_dir, program, grandchild, facts = one_daemon_with_a_run(
        daemons,
        stop_timeout="5s",
        work_seconds=60,
        timeout="1s",
        kill_grace="2s",
        ignore_term=True,
    )
    daemon.wait_log("past its timeout: sent SIGTERM to its process group; SIGKILL in 2 s", 10)
    daemon.wait_log("stdout| SIGTERM ignored", 10)
    assert program.alive, "the program died of SIGTERM"
    killed = daemon.wait_log("still running 2 s after SIGTERM: SIGKILL", 10)
    wait_dead(program, "the program")
    wait_dead(grandchild, "its grandchild sleep")
    row = ledger_row(lambda: embedded_ledger(state_dir, "work"), int(facts["run_id"]), "timed_out")
    assert row.started_at is not None
    assert row.finished_at is not None
    took = (row.finished_at - row.started_at).total_seconds()
    assert 2.5 <= took < 10, f"the run took {took} s; timeout 1 s + kill_grace 2 s expected"
    [term] = daemon.lines("past its timeout: sent SIGTERM")
    assert 1.5 <= (stamp(killed[0]) - stamp(term)).total_seconds() < 5
    stop_cleanly(daemon)
    summary(f"timeout 1 s, kill_grace 2 s, SIGTERM ignored: SIGKILL; timed_out after {took:.2f} s")


# ---- 6: HTTP --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get(url: str) -> tuple[int, str, bytes] | None:
    """Status, content type and body of GET ``url``; None when nobody answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as error:
        try:
            return error.code, error.headers.get("content-type", ""), error.read()
        finally:
            error.close()
    except (urllib.error.URLError, ConnectionError):
        return None


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def test_http_metrics_probes_and_status_page(daemons: Daemons, summary: Summary) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    state_dir = daemons.workdir / "state"
    settings = {
        "state_dir": str(state_dir),
        "replica_id": "web",
        "http": f"127.0.0.1:{port}",
        "stop_timeout": "5s",
    }
    daemon = daemons.start(
        "web", config_text(settings, [{"name": "beat", "every": "1s", "command": ["true"]}])
    )
    daemon.wait_log(f"serving /metrics, /healthz, /readyz and the status page on {base}/", 20)

    def answer(path: str, status: int = 200) -> tuple[int, str, bytes] | None:
        got = get(base + path)
        return got if got is not None and got[0] == status else None

    _, kind, body = daemons.wait_until("/healthz 200", lambda: answer("/healthz"), 20)
    assert kind == "application/json"
    health = json.loads(body)
    assert health["status"] == "ok", health
    assert health["replica"] == "web", health
    _, _, body = daemons.wait_until("/readyz 200", lambda: answer("/readyz"), 20)
    assert json.loads(body) == {"status": "ready", "problems": []}

    def scraped() -> str | None:
        got = answer("/metrics")
        if got is None:
            return None
        text = got[2].decode()
        runs = samples(text, "replicron_job_runs_total")
        ok = any(
            labels == {"job": "beat", "outcome": "succeeded"} and value >= 1
            for labels, value in runs
        )
        return text if ok and samples(text, "replicron_up") == [({}, 1.0)] else None

    metrics = daemons.wait_until("a succeeded run in /metrics, replicron_up 1", scraped, 20)
    assert "# TYPE replicron_job_runs_total counter" in metrics
    counts = {
        labels["outcome"]: value
        for labels, value in samples(metrics, "replicron_job_runs_total")
        if labels["job"] == "beat"
    }
    assert counts["failed"] == 0, counts

    page = answer("/")
    assert page is not None, get(base + "/")
    assert page[1].startswith("text/html")
    html = page[2].decode()
    assert "<html" in html.lower()
    assert "beat" in html
    assert "replicron: web.toml" in html

    listed = answer("/status.json")
    assert listed is not None, get(base + "/status.json")
    assert listed[1].startswith("application/json")
    status = json.loads(listed[2])
    assert [job["job"] for job in status["jobs"]] == ["beat"]
    assert [r["replica_id"] for r in status["replicas"]] == ["web"]
    assert answer("/no-such-page", 404), get(base + "/no-such-page")

    stop_cleanly(daemon)
    assert get(base + "/healthz") is None, "still serving after the daemon exited"
    summary(f"HTTP on port {port}: /healthz, /readyz, /metrics, /, /status.json answered")


# ---- 7: a failed command -------------------------------------------------------------------


def one_shell_run(daemons: Daemons, job: str, script: str) -> tuple[Child, Row]:
    """A daemon on ``state`` whose job runs ``sh -c script`` once; returns once the run is
    recorded, with its row."""
    state_dir = daemons.workdir / "state"
    settings = {"state_dir": str(state_dir), "replica_id": "solo", "stop_timeout": "5s"}
    spec = {"name": job, "every": "1s", "max_runs": 1, "command": ["sh", "-c", script]}
    daemon = daemons.start("solo", config_text(settings, [spec]))
    row = daemons.wait_until(
        "the run to be recorded",
        lambda: next((r for r in embedded_ledger(state_dir, job) if r.outcome), None),
        20,
    )
    return daemon, row


def test_a_failed_command_is_recorded_with_its_exit_status_and_stderr(
    daemons: Daemons, summary: Summary
) -> None:
    state_dir = daemons.workdir / "state"
    script = (
        "echo out-one; echo out-two; echo err-one >&2; echo err-two >&2; echo err-three >&2; exit 3"
    )
    daemon, row = one_shell_run(daemons, "fails", script)
    assert row.outcome == "failed", row
    assert row.error is not None
    assert "exit status 3" in row.error, row.error
    assert re.search(r"err-one\W+err-two\W+err-three", row.error), row.error
    assert "out-one" not in row.error
    for text in ("out-one", "out-two"):
        [line] = daemon.wait_log(f"stdout| {text}", 10)
        assert re.search(rf"\[solo\] fails\[{row.run_id}\] stdout\| {text}$", line), line
    [line] = daemon.wait_log("stderr| err-two", 10)
    assert f"fails[{row.run_id}]" in line
    status = status_json("--state-dir", str(state_dir))
    [view] = status["jobs"]
    assert view["last_outcome"] == "failed"
    assert "exit status 3" in view["last_error"]
    stop_cleanly(daemon)
    summary(f"exit 3: failed, error {row.error!r}")


def test_a_run_ends_when_its_program_exits_and_takes_its_background_children(
    daemons: Daemons, summary: Summary
) -> None:
    pidfile = daemons.workdir / "background.pid"
    # The background sleep holds the run's output pipe open for 60 s after the shell exits.
    script = f"sleep 60 & echo $! > {pidfile}; echo started"
    daemon, row = one_shell_run(daemons, "bg", script)
    assert row.outcome == "succeeded", row
    assert row.started_at is not None
    assert row.finished_at is not None
    took = (row.finished_at - row.started_at).total_seconds()
    assert took < 10, took  # the shell's exit, not the sleep's
    pid = int(pidfile.read_text())
    poll_until("the background sleep to be killed", lambda: process_start(pid) is None or None, 10)
    stop_cleanly(daemon)
    summary(f"a background child holding the output: the run took {took:.3f} s, the child killed")


def _signal_bits(line: str, field: str) -> int:
    """The mask a ``/proc/<pid>/status`` line (as the daemon logged it) gives ``field``."""
    found = re.search(rf"{field}:\W*([0-9a-f]{{16}})$", line)
    assert found is not None, line
    return int(found[1], 16)


def test_a_command_starts_with_default_signal_handling_whatever_the_daemon_inherited(
    daemons: Daemons, summary: Summary
) -> None:
    """Started from a script with ``&``, a daemon inherits SIGINT and SIGQUIT ignored (and
    a supervisor may leave signals blocked); an exec keeps both. Its commands must not."""
    state_dir = daemons.workdir / "state"
    spec = {
        "name": "signals",
        "every": "1s",
        "max_runs": 1,
        "command": ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"],
    }
    as_if_in_the_background = ["sh", "-c", 'trap "" INT QUIT; exec "$@"', "sh"]
    daemon = daemons.start(
        "background",
        config_text({"state_dir": str(state_dir)}, [spec]),
        wrap=lambda argv: as_if_in_the_background + argv,
    )
    [ignored] = daemon.wait_log("stdout| SigIgn:", 20)
    [blocked] = daemon.wait_log("stdout| SigBlk:", 20)
    with open(f"/proc/{daemon.pid}/status") as status:
        daemon_ignores = next(line for line in status if line.startswith("SigIgn:")).strip()
    quit_bit = 1 << (signal.SIGQUIT - 1)
    assert _signal_bits(daemon_ignores, "SigIgn") & quit_bit, "the daemon did not inherit it"
    assert (_signal_bits(ignored, "SigIgn"), _signal_bits(blocked, "SigBlk")) == (0, 0)
    stop_cleanly(daemon)
    summary(
        f"daemon started with SIGINT and SIGQUIT ignored ({daemon_ignores}): its command "
        "ignores and blocks nothing"
    )
