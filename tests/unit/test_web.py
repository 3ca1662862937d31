"""The status page as an ASGI server calls it: one request in, the response's messages out."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from replicron import AsyncScheduler, MemoryBackend, every, web
from replicron.cluster import ClusterStatus, JobView, Pause, Registration, ReplicaStatus
from replicron.errors import ArgumentTypeError, ConfigurationError
from replicron.testing import FakeClock
from replicron.web import status_app
from tests.helpers import Recorder

NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)
SECRET = "s3cr3t-Pa55"


def job_view(name: str, **changes: Any) -> JobView:
    """A job that ran fine 30 s ago and is due again in 30 s; ``changes`` set other fields."""
    view = JobView(
        job=name,
        trigger="every(30 s)",
        last_scheduled_at=NOW - timedelta(seconds=30),
        last_outcome="succeeded",
        last_replica="web-1",
        last_started_at=NOW - timedelta(seconds=30),
        last_finished_at=NOW - timedelta(seconds=28.5),
        last_error=None,
        last_success_at=NOW - timedelta(seconds=30),
        running=(),
        blocked_by=(),
        next_due=NOW + timedelta(seconds=30),
        overdue_since=None,
        paused=None,
        drift=(),
        missed=0,
        scheduled_by=("web-1",),
    )
    return replace(view, **changes)


def replica(replica_id: str, *, alive: bool = True, jobs: tuple[str, ...] = ()) -> ReplicaStatus:
    return ReplicaStatus(
        replica_id, 4242, 0.003, NOW - timedelta(hours=3), NOW - timedelta(seconds=2), alive, jobs
    )


def cluster(*jobs: JobView, namespace: str = "prod") -> ClusterStatus:
    return ClusterStatus(namespace, NOW, jobs, (replica("web-1", jobs=("report",)),))


def drift_registration(replica_id: str, trigger: str) -> Registration:
    return Registration(
        "sync", replica_id, trigger, f"fp-{trigger}", timedelta(minutes=1), (NOW,), NOW, True
    )


@dataclass
class Source:
    """A status source returning a fixed status, or failing with a fixed error."""

    status: ClusterStatus | None = None
    error: Exception | None = None
    reads: int = 0

    async def cluster_status(self) -> ClusterStatus:
        self.reads += 1
        if self.error is not None:
            raise self.error
        assert self.status is not None
        return self.status


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


def call(app: Any, path: str = "/", *, method: str = "GET", root_path: str = "") -> Response:
    """One HTTP request through the app, on an event loop of its own."""
    return asyncio.run(request(app, path, method=method, root_path=root_path))


async def request(
    app: Any, path: str = "/", *, method: str = "GET", root_path: str = ""
) -> Response:
    """One HTTP request through the app, the way an ASGI server makes it."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": root_path,
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    assert all(b["type"] == "http.response.body" for b in bodies)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return Response(start["status"], headers, b"".join(b.get("body", b"") for b in bodies))


def test_page_shows_every_job_fact_and_refreshes() -> None:
    failed = job_view(
        "report",
        last_outcome="failed",
        last_error="ValueError: bad row 7",
        last_success_at=NOW - timedelta(days=1),
    )
    overdue = job_view("cleanup", overdue_since=NOW - timedelta(minutes=6), missed=3)
    running = job_view("digest", running=(("web-2", 812),), blocked_by=(("web-9", 77),))
    paused = job_view("rotate", paused=Pause("rotate", NOW - timedelta(hours=2), "alice"))
    drifted = job_view(
        "sync",
        drift=(
            drift_registration("web-1", "every(1 min)"),
            drift_registration("web-2", "every(2 min)"),
        ),
    )
    app = status_app(Source(cluster(failed, overdue, running, paused, drifted)), refresh=7)
    response = call(app)
    assert response.status == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert int(response.headers["content-length"]) == len(response.body)
    assert response.headers["cache-control"] == "no-store"
    page = response.text
    assert '<meta http-equiv="refresh" content="7">' in page
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert "<script" not in page  # nothing to run, nothing to build
    for fact in (
        "prod",  # namespace
        "2026-05-04 12:00:00 UTC",  # read time
        "FAILED",
        "ValueError: bad row 7",
        "OVERDUE",
        "tick due 11:54:00 UTC has no run (6 min late)",
        ">running<",
        "running on web-2 (run 812)",
        "BLOCKED",
        "blocked by a frozen run: web-9 (run 77)",
        ">paused<",
        "paused by alice, 2 h ago",
        "DRIFT",
        "every(1 min)",
        "every(2 min)",
        "took 1.5 s",  # last run's duration
        "24 h ago",  # last success of the failing job
        "in 30 s",  # next due
    ):
        assert fact in page, fact
    # Problems first, each of status.problems() once.
    for line in cluster(failed, overdue, running, paused, drifted).problems():
        assert page.count(line.replace("'", "&#x27;")) == 1, line
    assert page.index("Problems (") < page.index("<table")
    assert "All good" not in page


def test_failed_and_overdue_rows_stand_out_in_words_and_colour() -> None:
    status = cluster(
        job_view("fine"),
        job_view("broken", last_outcome="timed_out"),
        job_view("late", overdue_since=NOW - timedelta(minutes=2)),
    )
    page = call(status_app(Source(status))).text
    rows = page.split("<tr")[2:]  # after the heading row
    by_job = {row.split('<div class="job">')[1].split("<")[0]: row for row in rows[:3]}
    assert by_job["broken"].startswith(' class="bad"')
    assert "TIMED OUT" in by_job["broken"]
    assert by_job["late"].startswith(' class="warn"')
    assert "OVERDUE" in by_job["late"]
    assert by_job["fine"].startswith(">")
    assert ">ok<" in by_job["fine"]
    # Jobs to act on come first.
    assert list(by_job) == ["broken", "late", "fine"]


def test_all_good_when_there_are_no_problems() -> None:
    page = call(status_app(Source(cluster(job_view("fine"))))).text
    assert "All good: no problems" in page
    assert "Problems (" not in page


def test_an_empty_cluster_renders() -> None:
    empty = ClusterStatus("", NOW, (), ())
    response = call(status_app(Source(empty)))
    assert response.status == 200
    assert "No jobs registered or run yet." in response.text
    assert "No replica has registered." in response.text
    assert "All good" in response.text


def test_everything_from_the_cluster_is_escaped() -> None:
    evil = "<script>alert(1)</script>"
    status = ClusterStatus(
        f"ns{evil}",
        NOW,
        (
            job_view(
                f"job{evil}",
                trigger=f"cron('{evil}')",
                last_outcome="failed",
                last_error=f'boom {evil} "quoted" & more',
                last_replica=f"r{evil}",
                running=((f"w{evil}", 1),),
                paused=Pause("x", NOW, f"by{evil}"),
            ),
        ),
        (replica(f"rep{evil}", jobs=(f"job{evil}",)),),
    )
    page = call(status_app(Source(status), title=f"T{evil}")).text
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("&lt;script&gt;") >= 9
    assert "&quot;quoted&quot; &amp; more" in page


def test_json_is_the_status_to_json() -> None:
    status = cluster(
        job_view("report", last_outcome="failed", last_error="ValueError: x"),
        job_view("cleanup", overdue_since=NOW - timedelta(minutes=6)),
    )
    response = call(status_app(Source(status)), "/status.json")
    assert response.status == 200
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body) == status.to_json()


def test_a_password_in_a_job_error_is_masked_on_the_page_and_in_json() -> None:
    error = f"OperationalError: connection to postgresql://app:{SECRET}@db:5432/app failed"
    status = cluster(job_view("report", last_outcome="failed", last_error=error))
    app = status_app(Source(status))
    page = call(app).text
    data = json.loads(call(app, "/status.json").body)
    assert SECRET not in page
    assert SECRET not in json.dumps(data)
    assert "postgresql://app:***@db:5432/app" in page
    assert data["jobs"][0]["last_error"].endswith("postgresql://app:***@db:5432/app failed")


def test_a_failed_read_is_a_503_page_with_the_masked_one_line_error() -> None:
    source = Source(
        error=ConnectionError(
            f"could not connect to postgresql://admin:{SECRET}@db.internal:5432/jobs\n"
            f"DETAIL: password={SECRET} was refused"
        )
    )
    app = status_app(source, refresh=5)
    response = call(app)
    assert response.status == 503
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    page = response.text
    assert SECRET not in page
    assert "ConnectionError: could not connect to postgresql://admin:***@db.internal:5432/jobs" in (
        page
    )
    assert "DETAIL" not in page  # one line
    assert '<meta http-equiv="refresh" content="5">' in page  # recovers on its own
    as_json = call(app, "/status.json")
    assert as_json.status == 503
    assert SECRET not in as_json.text
    assert json.loads(as_json.body) == {
        "error": "ConnectionError: could not connect to "
        "postgresql://admin:***@db.internal:5432/jobs"
    }
    assert source.reads == 2


def test_a_keyword_dsn_password_is_masked_too() -> None:
    source = Source(error=RuntimeError(f"host=db user=app password={SECRET} dbname=x: refused"))
    page = call(status_app(source)).text
    assert SECRET not in page
    assert "password=***" in page


def test_a_read_that_hangs_is_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    class Hangs:
        async def cluster_status(self) -> ClusterStatus:
            await asyncio.Event().wait()  # never set: only the page's own timeout ends it
            raise AssertionError("unreachable")

    monkeypatch.setattr(web, "_READ_TIMEOUT", 0.01)
    response = call(status_app(Hangs()))
    assert response.status == 503
    assert "took longer than 0.01 s" in response.text


@pytest.mark.parametrize(
    ("root_path", "path"),
    [
        ("/jobs", "/jobs/"),  # Starlette's Mount and uvicorn --root-path keep the prefix
        ("/jobs", "/jobs"),
        ("/jobs", "/"),  # servers that strip it
        ("/jobs/", "/jobs/"),
        ("/a/b", "/a/b/"),
    ],
)
def test_mounted_under_a_root_path(root_path: str, path: str) -> None:
    app = status_app(Source(cluster(job_view("report"))))
    response = call(app, path, root_path=root_path)
    assert response.status == 200
    base = root_path.rstrip("/")
    assert f'href="{base}/status.json"' in response.text
    suffix = "status.json" if path.endswith("/") else "/status.json"
    as_json = call(app, path + suffix, root_path=root_path)
    assert as_json.status == 200
    assert json.loads(as_json.body)["jobs"][0]["job"] == "report"


def test_unmounted_links_are_absolute_from_the_root() -> None:
    page = call(status_app(Source(cluster()))).text
    assert 'href="/status.json"' in page


@pytest.mark.parametrize("path", ["/nope", "/status.json/", "/status", "/jobs/", "/index.html"])
def test_other_paths_are_404(path: str) -> None:
    source = Source(cluster())
    response = call(status_app(source), path)
    assert response.status == 404
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert source.reads == 0


def test_a_path_outside_the_root_path_is_404() -> None:
    response = call(status_app(Source(cluster())), "/other/status.json", root_path="/jobs")
    assert response.status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", ["/", "/status.json"])
def test_other_methods_are_405(method: str, path: str) -> None:
    source = Source(cluster())
    response = call(status_app(source), path, method=method)
    assert response.status == 405
    assert response.headers["allow"] == "GET, HEAD"
    assert source.reads == 0


def test_head_answers_like_get_without_a_body() -> None:
    app = status_app(Source(cluster(job_view("report"))))
    for path in ("/", "/status.json"):
        got, head = call(app, path), call(app, path, method="HEAD")
        assert head.status == got.status == 200
        assert head.body == b""
        assert head.headers == got.headers


def test_security_headers() -> None:
    headers = call(status_app(Source(cluster()))).headers
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src" not in policy  # falls back to 'none'
    assert headers["x-content-type-options"] == "nosniff"


def test_requests_close_together_share_one_read() -> None:
    """Many open pages refreshing must not each read the database: a read serves the
    requests of the next two seconds."""
    source = Source(cluster(job_view("report")))
    app = status_app(source)
    call(app)
    source.status = cluster(job_view("report", last_outcome="failed"))
    assert "FAILED" not in call(app).text
    assert json.loads(call(app, "/status.json").body)["jobs"][0]["last_outcome"] == "succeeded"
    assert source.reads == 1


@pytest.mark.parametrize(("refresh", "shown"), [(2.5, "3"), (0.2, "1"), (60, "60")])
def test_refresh_is_whole_seconds_at_least_one(refresh: float, shown: str) -> None:
    page = call(status_app(Source(cluster()), refresh=refresh)).text
    assert f'<meta http-equiv="refresh" content="{shown}">' in page
    assert f"refreshes every {shown} s" in page


def test_title_names_the_tab_with_the_problem_count() -> None:
    status = cluster(job_view("report", last_outcome="failed"), namespace="billing")
    page = call(status_app(Source(status), title="Billing jobs")).text
    assert "<title>(1) Billing jobs · billing</title>" in page
    assert "<h1>Billing jobs</h1>" in page


@pytest.mark.parametrize("refresh", [0, -1, float("nan"), float("inf")])
def test_refresh_must_be_positive(refresh: float) -> None:
    with pytest.raises(ConfigurationError, match="refresh"):
        status_app(Source(cluster()), refresh=refresh)


def test_arguments_of_the_wrong_type() -> None:
    with pytest.raises(ArgumentTypeError, match="cluster_status"):
        status_app(object())  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="refresh"):
        status_app(Source(cluster()), refresh="10")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="title"):
        status_app(Source(cluster()), title=None)  # type: ignore[arg-type]


def test_lifespan_and_websocket_scopes() -> None:
    app = status_app(Source(cluster()))
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def serve(scope: dict[str, Any]) -> None:
        await app(scope, receive, send)

    asyncio.run(serve({"type": "lifespan"}))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    sent.clear()
    asyncio.run(serve({"type": "websocket", "path": "/"}))
    assert sent == [{"type": "websocket.close", "code": 1000}]


def test_replicas_show_state_offset_and_jobs() -> None:
    status = ClusterStatus(
        "",
        NOW,
        (),
        (
            ReplicaStatus("web-1", 11, 0.012, NOW - timedelta(hours=3), NOW, True, ("a", "b")),
            ReplicaStatus("web-2", None, -1.5, NOW, NOW - timedelta(hours=20), False),
            ReplicaStatus("web-3", None, None, NOW, NOW, True),
        ),
    )
    page = call(status_app(Source(status))).text
    section = page[page.index("Replicas (2 alive, 1 departed)") :]
    assert "ALIVE" in section
    assert "GONE" in section
    assert "process id 11" in section
    assert "12 ms behind" in section
    assert "1.50 s ahead" in section
    assert "not measured" in section
    assert "20 h ago" in section
    assert "a, b" in section
    # Live replicas first.
    assert section.index("web-3") < section.index("web-2")
    assert "LEADER" not in section


def test_the_leader_replica_is_marked() -> None:
    replicas = (
        ReplicaStatus("web-1", None, None, NOW, NOW, True),
        ReplicaStatus("web-2", None, None, NOW, NOW, True),
    )
    page = call(status_app(Source(ClusterStatus("", NOW, (), replicas, leader="web-2")))).text
    section = page[page.index("Replicas (2 alive)") :]
    assert section.count("LEADER") == 1
    assert section.index("web-2") < section.index("LEADER")


def test_departed_replicas_are_counted_and_folded_away_below_the_live_ones() -> None:
    # Three short runs of two replicas each, with the default replica id (a process each),
    # then the two that run now.
    departed = tuple(
        ReplicaStatus(f"web:{pid}", pid, None, NOW, NOW - timedelta(minutes=pid), False)
        for pid in range(100, 106)
    )
    live = tuple(
        ReplicaStatus(f"web:{pid}", pid, None, NOW, NOW, True, pid_label="PostgreSQL backend pid")
        for pid in (200, 201)
    )
    page = call(status_app(Source(ClusterStatus("", NOW, (), departed + live)))).text
    section = page[page.index("Replicas (2 alive, 6 departed)") :]
    shown, folded = section.split("<details", 1)
    assert [f"web:{pid}" in shown for pid in (200, 201, 100)] == [True, True, False]
    assert "PostgreSQL backend pid 200" in shown
    assert "6 departed (stopped or died)" in folded
    # The latest seen first.
    assert folded.index("web:100") < folded.index("web:105")
    assert '<div class="n num">2</div><div class="l">Replicas alive</div>' in page


def test_a_blocking_source_is_read_off_the_event_loop() -> None:
    """The threaded Scheduler's cluster_status() blocks for a round trip to the backend."""

    class Blocking:
        def __init__(self) -> None:
            self.threads: list[threading.Thread] = []

        def cluster_status(self) -> ClusterStatus:
            self.threads.append(threading.current_thread())
            return cluster(job_view("report"))

    source = Blocking()
    response = call(status_app(source))
    assert response.status == 200
    assert "report" in response.text
    assert source.threads
    assert source.threads[0] is not threading.current_thread()


def test_an_async_scheduler_is_a_source() -> None:
    def broken() -> None:
        raise ValueError("row 7 has no id")

    async def main() -> Response:
        clock, recorder = FakeClock(NOW), Recorder()
        scheduler = AsyncScheduler(
            clock=clock, backend=MemoryBackend(), replica_id="web-1", listeners=[recorder]
        )
        scheduler.add_job(every(seconds=5), broken, name="import-rows")
        async with scheduler:  # registered as it starts
            for _ in range(10_000):  # yield until the scheduler waits on the fake clock
                if clock.sleepers:
                    break
                await asyncio.sleep(0)
            clock.advance(timedelta(seconds=5))
            await recorder.await_count("after_failure", 1)
            await scheduler.wait_idle()
            return await request(status_app(scheduler))

    response = asyncio.run(main())
    assert response.status == 200
    assert "FAILED" in response.text
    assert "ValueError: row 7 has no id" in response.text
    assert "import-rows: last run failed" in response.text


def test_the_page_shows_the_problems_the_status_has_and_no_others() -> None:
    """A failure of a job no replica registers is history after a day: not a problem for
    ``problems()`` and ``--check``, so not FAILED on the page either."""
    long_ago = NOW - timedelta(days=2)
    history = job_view(
        "dropped",
        trigger=None,
        registered=False,
        scheduled_by=(),
        last_outcome="failed",
        last_error="RuntimeError: gone",
        last_scheduled_at=long_ago,
        last_started_at=long_ago,
        last_finished_at=long_ago,
        next_due=None,
    )
    recent = replace(history, job="dropped-today", last_finished_at=NOW - timedelta(hours=2))
    status = cluster(history, recent)
    assert status.problems() == [
        f"dropped-today: last run failed (tick {long_ago.isoformat()}): RuntimeError: gone"
    ]
    page = call(status_app(Source(status))).text
    assert "<title>(1) replicron · prod</title>" in page
    rows = {row.split('<div class="job">')[1].split("<")[0]: row for row in page.split("<tr")[2:4]}
    assert list(rows) == ["dropped-today", "dropped"]  # the one to act on first
    assert rows["dropped-today"].startswith(' class="bad"')
    assert ">FAILED<" in rows["dropped-today"]
    assert rows["dropped"].startswith(">")
    assert ">FAILED<" not in rows["dropped"]
    assert ">unregistered<" in rows["dropped"]
    assert "RuntimeError: gone" in rows["dropped"]  # still its last error, as a fact
    assert '<div class="n num">1</div><div class="l">Failing</div>' in page


def test_a_job_has_one_badge_per_kind_of_problem_the_worst_first() -> None:
    drifted = job_view(
        "sync",
        last_outcome="abandoned",
        overdue_since=NOW - timedelta(minutes=3),
        blocked_by=(("web-8", 5), ("web-9", 6)),
        drift=(
            drift_registration("web-1", "every(1 min)"),
            drift_registration("web-2", "every(2 min)"),
        ),
    )
    status = cluster(drifted)
    assert len(status.problems()) == 5
    page = call(status_app(Source(status))).text
    row = page.split("<tr")[2]
    badges = [part.split("<")[0] for part in row.split('<span class="badge ')[1:]]
    assert badges == ['bad">ABANDONED', 'bad">BLOCKED', 'warn">OVERDUE', 'warn">DRIFT']
    assert "blocked by a frozen run: web-8 (run 5), web-9 (run 6)" in row
    assert "<title>(5) replicron · prod</title>" in page
