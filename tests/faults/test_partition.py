"""A replica cut off mid-run, by the network (a two-way partition, nothing but timeouts can
notice) or by the scheduler of its host (SIGSTOP past staleness): it must stop its run before
any other replica starts the job, another replica must take over within a bound (or, for a
frozen process whose session still holds the lock, nobody may), and the records stay honest.
A holder killed outright must leave nothing held."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.faults.analysis import Window, assert_invariants
from tests.faults.cluster import Database
from tests.faults.fleet import Fleet, both_modes
from tests.faults.netns import NetworkNamespace
from tests.faults.proxy import HangingProxy

Summary = Callable[[str], None]
HEARTBEAT, STALE = 0.5, 1.5  # the replicas' heartbeat_interval and stale_after
#: PostgresBackend's own, which the partition scenario runs with.
DEFAULT_HEARTBEAT, DEFAULT_STALE = 5.0, 15.0
LONG_TASK_MS = 8000  # runs that are going on when the fault hits


def first_start(replicas: Fleet, replica_id: str, timeout: float = 15.0) -> dict[str, Any]:
    pid = replicas.current[replica_id].pid

    def started() -> dict[str, Any] | None:
        found = [e for e in replicas.events("start") if e["pid"] == pid]
        return found[0] if found else None

    return replicas.wait_until(f"{replica_id} to start a run", started, timeout)


def runs_since(replicas: Fleet, after: float) -> list[dict[str, Any]]:
    return [e for e in replicas.events("start") if float(e["mono"]) > after]


def runs_of_others(replicas: Fleet, pid: int, after: float) -> list[dict[str, Any]]:
    return [e for e in replicas.events("start") if e["pid"] != pid and float(e["mono"]) > after]


def finish_of(replicas: Fleet, run: dict[str, Any]) -> dict[str, Any] | None:
    for event in replicas.events("finish"):
        if event["pid"] == run["pid"] and event["tick"] == run["tick"]:
            return event
    return None


def freeze_the_holder(replicas: Fleet) -> tuple[dict[str, Any], dict[str, float], float]:
    """r1 starts a run of the one job, r2 joins, and a second into the run r1 is frozen
    (SIGSTOP). Runs outlast the freeze, so the frozen run is still going when it wakes. The
    run's start event, r2's ready time and when r1 was frozen (monotonic)."""
    replicas.start("r1", jobs=1, every_s=1, task_ms=3 * LONG_TASK_MS)
    replicas.wait_ready(["r1"])
    victim = first_start(replicas, "r1")
    replicas.start("r2", jobs=1, every_s=1, task_ms=3 * LONG_TASK_MS)
    ready = replicas.wait_ready(["r2"])
    time.sleep(max(0.0, float(victim["mono"]) + 1.0 - time.monotonic()))
    replicas.pause("r1")
    return victim, ready, time.monotonic()


@both_modes
@pytest.mark.timeout(180)
def test_a_two_way_partition_mid_run(
    replicas: Fleet, netns: NetworkNamespace, db: Database, summary: Summary
) -> None:
    heartbeat, stale = DEFAULT_HEARTBEAT, DEFAULT_STALE
    task_ms = int(1000 * 4 * stale) + LONG_TASK_MS  # still going when another takes over
    replicas.start(
        "r1",
        jobs=1,
        every_s=1,
        task_ms=task_ms,
        in_namespace=True,
        heartbeat_interval=heartbeat,
        stale_after=stale,
    )
    replicas.wait_ready(["r1"])
    victim = first_start(replicas, "r1")
    for replica_id in ("r2", "r3"):
        replicas.start(
            replica_id,
            jobs=1,
            every_s=1,
            task_ms=task_ms,
            heartbeat_interval=heartbeat,
            stale_after=stale,
        )
    ready = replicas.wait_ready(["r2", "r3"])
    time.sleep(max(0.0, float(victim["mono"]) + heartbeat + 1.0 - time.monotonic()))
    netns.partition()
    cut = time.monotonic()
    pid = victim["pid"]
    taken_over = replicas.wait_until(
        "another replica to take the job over",
        lambda: runs_of_others(replicas, pid, cut) or None,
        4 * stale + 20,
    )[0]
    takeover = float(taken_over["mono"]) - cut
    stopped = finish_of(replicas, victim)
    assert stopped is not None, "the cut-off replica's run was still going at the takeover"
    assert stopped["cancelled"] is True
    stop = float(stopped["mono"]) - cut
    time.sleep(3)
    netns.heal()
    healed = time.monotonic()
    # The cut-off replica reconnects and writes the outcome of its run.
    db.wait_until(
        "the cut-off run's outcome",
        lambda: (
            db.rows(
                "SELECT outcome FROM replicron_runs WHERE run_id = %s AND outcome IS NOT NULL",
                (victim["run_id"],),
            )
            or None
        ),
        30,
    )
    window = Window.from_monotonic(max(ready.values()) + 0.5, healed + 3)
    replicas.wait_until("the window to end", lambda: time.monotonic() > healed + 5, 30)
    codes = replicas.stop()
    analysis = replicas.assert_invariants(window)
    [victim_row] = [row for row in analysis.ledger if row.run_id == victim["run_id"]]
    summary(
        f"[partition of r1 mid-run, both directions, heartbeat {heartbeat:g} s, stale_after "
        f"{stale:g} s] {analysis} | cut-off run told to stop {stop:.2f} s after the cut, another "
        f"replica started the job {takeover:.2f} s after it (margin {takeover - stop:.2f} s); "
        f"cut-off row {victim_row.outcome!r} ({victim_row.error}); outcomes="
        f"{dict(Counter(str(r.outcome) for r in analysis.ledger))} exit={codes}"
    )
    assert stop < takeover, "two runs at once: the cut-off replica stopped after the takeover"
    assert stop <= stale - heartbeat + 0.5  # its lease, measured from its last heartbeat
    # The server drops the cut-off session (keepalives, tcp_user_timeout) about stale_after
    # after its last statement; the next tick after that is claimed.
    assert takeover < stale + 4 * heartbeat + 2
    assert victim_row.outcome == "abandoned"


@pytest.mark.timeout(120)
def test_a_proxy_that_stops_forwarding_mid_run(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    """Between r1 and PostgreSQL, a proxy hangs with every socket open: no FIN, no RST, no
    missing ACK, so the server keeps r1's session and its lock, as for a frozen process. r1
    stops its run within its lease (statement deadlines: no heartbeat gets through). r2, with
    fence_stale_holders, terminates the session that blocks the job, and takes over."""
    proxy = HangingProxy(("127.0.0.1", db.cluster.port))
    try:
        replicas.start("r1", jobs=1, every_s=1, task_ms=LONG_TASK_MS, dsn=proxy.dsn(db.name))
        replicas.wait_ready(["r1"])
        victim = first_start(replicas, "r1")
        replicas.start("r2", jobs=1, every_s=1, task_ms=LONG_TASK_MS, fence_stale_holders=True)
        ready = replicas.wait_ready(["r2"])
        time.sleep(max(0.0, float(victim["mono"]) + 1.5 - time.monotonic()))
        proxy.hang()
        hung = time.monotonic()
        taken = replicas.wait_until(
            "r2 to take over", lambda: runs_of_others(replicas, victim["pid"], hung) or None, 40
        )[0]
        stopped = finish_of(replicas, victim)
        assert stopped is not None, "r1's run was still going when r2 started the job"
        window = Window.from_monotonic(max(ready.values()) + 0.5, time.monotonic() + 2)
        replicas.wait_window_end(window)
        codes = replicas.stop()
    finally:
        proxy.close()
    analysis = replicas.analyse(window)
    stop, takeover = float(stopped["mono"]) - hung, float(taken["mono"]) - hung
    summary(
        f"[proxy stops forwarding mid-run, sockets open; r2 fences stale holders] {analysis} | "
        f"r1 told its run to stop {stop:.2f} s after the hang, r2 started the job "
        f"{takeover:.2f} s after it; exit={codes}"
    )
    assert stopped["cancelled"] is True
    assert stop < takeover
    assert takeover < 10.0
    assert codes == {"r1": 0, "r2": 0}  # r1's shutdown does not hang on the proxy
    # r1 could not write its run's outcome through the hung proxy: the row went stale and
    # r2's janitor (or the next claim) decides; nothing overlaps, nothing runs twice.
    assert analysis.duplicates == []
    assert analysis.overlaps == []
    assert analysis.unrecorded == []


@pytest.mark.timeout(120)
def test_sigstop_of_the_holder_past_staleness(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    """A frozen process keeps its server session (the kernel still answers for it), so its
    lock holds: nobody may start the job, the janitor must not write the run off, the other
    replicas warn that the job is blocked; once it wakes, it stops the run at once (its lease
    ran out meanwhile) and the job moves on."""
    victim, ready, frozen_at = freeze_the_holder(replicas)
    time.sleep(5 * STALE)
    assert runs_of_others(replicas, victim["pid"], frozen_at) == [], "ran while r1 was frozen"
    [(outcome,)] = db.rows(
        "SELECT outcome FROM replicron_runs WHERE run_id = %s", (victim["run_id"],)
    )
    assert outcome is None, "the janitor wrote off a run whose lock is still held"
    replicas.resume("r1")
    woke = time.monotonic()
    stopped = replicas.wait_until("r1 to stop its run", lambda: finish_of(replicas, victim), 10)
    # The job moves on: the next tick runs on whichever replica claims it first (r1 may, now
    # that its run is over: no overlap either way, the invariants below check it).
    taken = replicas.wait_until(
        "the job to run again", lambda: runs_since(replicas, woke) or None, 20
    )[0]
    window = Window.from_monotonic(max(ready.values()) + 0.5, time.monotonic() + 2)
    replicas.wait_window_end(window)
    codes = replicas.stop()
    analysis = replicas.assert_invariants(window)
    [row] = [row for row in analysis.ledger if row.run_id == victim["run_id"]]
    warned = "is blocked by replica r1" in replicas.logs()
    summary(
        f"[SIGSTOP of the holder for {woke - frozen_at:.1f} s, stale_after {STALE} s] "
        f"{analysis} | runs started while frozen=0, janitor wrote it off=no, r2 warned="
        f"{warned}; after SIGCONT the run stopped in {float(stopped['mono']) - woke:.2f} s and "
        f"{taken['replica']} started it {float(taken['mono']) - woke:.2f} s after; frozen row "
        f"{row.outcome!r} "
        f"({row.error}) exit={codes}"
    )
    assert stopped["cancelled"] is True
    assert float(stopped["mono"]) - woke < 1.0
    assert warned
    assert row.outcome == "abandoned"
    assert "stopped heartbeating" not in (row.error or "")
    assert not _overwritten(replicas)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coordination", ["lease"])
def test_sigstop_of_the_holder_past_its_lease(
    replicas: Fleet, db: Database, summary: Summary
) -> None:
    """Lease mode: a frozen process holds nothing on the server, so once its lease has run out
    another replica takes the job over while it sleeps. Woken, its run reads as cancelled
    before it does anything more, is recorded abandoned, and writes nothing over the run that
    took over. The frozen run counts as ended when it was frozen, since it did nothing after."""
    victim, ready, frozen_at = freeze_the_holder(replicas)
    taken = replicas.wait_until(
        "r2 to take the job over",
        lambda: runs_of_others(replicas, victim["pid"], frozen_at) or None,
        STALE + 10 * HEARTBEAT + 5,
    )[0]
    time.sleep(max(0.0, float(taken["mono"]) + 2.0 - time.monotonic()))
    woke = time.monotonic()
    replicas.resume("r1")
    stopped = replicas.wait_until("r1 to stop its run", lambda: finish_of(replicas, victim), 10)
    window = Window.from_monotonic(max(ready.values()) + 0.5, time.monotonic() + 2)
    replicas.wait_window_end(window)
    codes = replicas.stop()
    analysis = replicas.analyse(window)
    fenced = stopped["cancelled"] is True and float(stopped["mono"]) - woke < 0.5
    # Fenced, the frozen run did nothing after the freeze: it overlaps only what started before.
    others = [
        (a, b)
        for a, b in analysis.overlaps
        if not (fenced and a.run_id == victim["run_id"] and b.start_mono >= frozen_at)
    ]
    analysis = dataclasses.replace(analysis, overlaps=others)
    assert_invariants(analysis)
    [row] = [row for row in analysis.ledger if row.run_id == victim["run_id"]]
    [taken_row] = [row for row in analysis.ledger if row.run_id == taken["run_id"]]
    summary(
        f"[SIGSTOP of the holder for {woke - frozen_at:.1f} s, stale_after {STALE} s] "
        f"{analysis} (the frozen run ends at the freeze) | r2 took the job over "
        f"{float(taken['mono']) - frozen_at:.2f} s after the freeze; after SIGCONT the frozen "
        f"run stopped in {float(stopped['mono']) - woke:.3f} s "
        f"(cancelled={stopped['cancelled']}); frozen row {row.outcome!r} ({row.error}); "
        f"r2's row {taken_row.outcome!r} exit={codes}"
    )
    assert fenced, f"the woken run went on: {stopped}"
    # Not before the frozen run's lease ended: renewed at most a heartbeat before the freeze,
    # it lasted stale_after from then; and not much after it.
    took = float(taken["mono"]) - frozen_at
    assert STALE - HEARTBEAT - 0.1 <= took < STALE + 10 * HEARTBEAT
    assert row.outcome == "abandoned"


@both_modes
@pytest.mark.timeout(120)
def test_kill_9_of_the_holder_mid_run(replicas: Fleet, db: Database, summary: Summary) -> None:
    """A holder killed mid-run leaves nothing held: advisory mode's lock goes with its session
    at once, lease mode's job lock once its lease runs out. Another replica runs the job's
    next tick within a bound, the killed run's row is written off as abandoned, and no tick
    runs twice or goes without a row."""
    replicas.start("r1", jobs=1, every_s=1, task_ms=3 * LONG_TASK_MS)
    replicas.wait_ready(["r1"])
    victim = first_start(replicas, "r1")
    replicas.start("r2", jobs=1, every_s=1, task_ms=LONG_TASK_MS // 8)
    ready = replicas.wait_ready(["r2"])
    time.sleep(max(0.0, float(victim["mono"]) + 1.0 - time.monotonic()))
    replicas.kill("r1")
    killed_at = time.monotonic()
    taken = replicas.wait_until(
        "r2 to run the job",
        lambda: runs_of_others(replicas, victim["pid"], killed_at) or None,
        STALE + 10 * HEARTBEAT + 5,
    )[0]
    window = Window.from_monotonic(max(ready.values()) + 0.5, time.monotonic() + 2)

    def written_off() -> bool:
        return any(r.run_id == victim["run_id"] and r.outcome for r in db.ledger())

    # The janitor writes a dead replica's runs off every twelfth heartbeat.
    replicas.wait_until("the killed run to be written off", written_off, 12 * HEARTBEAT + 5)
    replicas.wait_window_end(window)
    codes = replicas.stop()
    analysis = replicas.analyse(window)
    assert_invariants(analysis)
    [row] = [row for row in analysis.ledger if row.run_id == victim["run_id"]]
    took = float(taken["mono"]) - killed_at
    summary(
        f"[kill -9 of the holder mid-run, stale_after {STALE} s] {analysis} | r2 ran the job "
        f"{took:.2f} s after the kill; killed row {row.outcome!r} ({row.error}) exit={codes}"
    )
    assert row.outcome == "abandoned"
    # The dead run counts as going on until its heartbeat (and lease) could have run out:
    # not long before stale_after, and not much after it.
    assert STALE - HEARTBEAT - 0.1 <= took < STALE + 10 * HEARTBEAT


def _overwritten(replicas: Fleet) -> bool:
    return "replaced 'abandoned'" in replicas.logs()


@both_modes
@pytest.mark.timeout(120)
def test_shutdown_while_cut_off_is_bounded(
    replicas: Fleet, netns: NetworkNamespace, summary: Summary
) -> None:
    """SIGTERM reaches a replica that cannot reach PostgreSQL: it stops within its stop
    timeout and a few seconds, whatever its pending statements and outcomes; the replica
    that can reach it records every tick."""
    stop_timeout = 3.0
    replicas.start(
        "r1", jobs=2, every_s=1, task_ms=100, in_namespace=True, stop_timeout=stop_timeout
    )
    replicas.start("r2", jobs=2, every_s=1, task_ms=100)
    ready = replicas.wait_ready(["r1", "r2"])
    time.sleep(max(0.0, max(ready.values()) + 2 - time.monotonic()))
    netns.partition()
    time.sleep(2.5)
    asked = time.monotonic()
    codes = replicas.stop(["r1"], timeout=60)
    took = time.monotonic() - asked
    netns.heal()
    window = Window.from_monotonic(max(ready.values()) + 0.5, time.monotonic() + 1)
    replicas.wait_window_end(window)
    codes |= replicas.stop()
    analysis = replicas.assert_invariants(window, leak_grace_s=10)
    summary(
        f"[SIGTERM to a replica cut off for 2.5 s, stop_timeout {stop_timeout:g} s] {analysis} "
        f"| it exited {took:.1f} s after SIGTERM; exit={codes}"
    )
    assert codes == {"r1": 0, "r2": 0}
    assert took < stop_timeout + 5
