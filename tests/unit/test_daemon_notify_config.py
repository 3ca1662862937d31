"""A daemon config's ``[notify]`` table and jobs' ``ping_url``: read into a notifier's
settings, and every bad value a problem naming the table or job and the field, URLs masked;
``replicron check`` reports them as a real process."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from replicron import AsyncScheduler, every
from replicron.daemon import ConfigError
from replicron.daemon._notify_config import Alerts, NotifyConfig, make_notifier
from replicron.daemon.config import parse_config
from replicron.testing import FakeClock
from tests.helpers import START
from tests.receiver import Receiver, receiving
from tests.unit.test_daemon_check import replicron, write

GOOD = """
[notify]
url = "https://hooks.slack.com/services/T0/B0/${HOOK_TOKEN}"
events = ["failed", "overdue"]
tags = "critical"
headers = { Authorization = "Bearer ${API_TOKEN}" }
link = "https://grafana.example/d/jobs?var-job={job}"
timeout = "3s"
attempts = 4
backoff = "500ms"
max_queue = 50

[[job]]
name = "nightly"
cron = "0 3 * * *"
command = ["true"]
tags = ["critical"]
ping_url = "https://hc-ping.com/${PING_UUID}"
"""
ENV = {"HOOK_TOKEN": "XXXXSECRET", "API_TOKEN": "tok-123456", "PING_UUID": "0f1e-uuid-2d3c"}


def test_notify_and_ping_url_are_read_with_variables_expanded() -> None:
    config = parse_config(GOOD, "jobs.toml", ENV)
    assert config.notify is not None
    assert config.notify.settings == {
        "url": "https://hooks.slack.com/services/T0/B0/XXXXSECRET",
        "events": ("failed", "overdue"),
        "tags": ("critical",),
        "headers": {"Authorization": "Bearer tok-123456"},
        "link": "https://grafana.example/d/jobs?var-job={job}",
        "timeout": 3.0,
        "attempts": 4,
        "backoff": 0.5,
        "max_queue": 50,
    }
    assert config.jobs[0].ping_url == "https://hc-ping.com/0f1e-uuid-2d3c"
    notifier = make_notifier(config.notify, [("nightly", "https://hc-ping.com/x")], "ns/")
    assert repr(notifier) == (
        "Notifier(https://hooks.slack.com/***, events=['failed', 'overdue'], "
        "pings=['nightly'], headers=['Authorization'])"
    )
    assert make_notifier(None, [], "") is None


BAD = """
[notify]
url = "ftp://user:pw-SECRET@example.com/x"
evnts = ["failed"]
events = ["fialed"]
attempts = 0
timeout = "soon"

[[job]]
name = "nightly"
cron = "0 3 * * *"
command = ["true"]
ping_url = "hc-ping.com/0f1e-uuid-2d3c"
"""


def test_every_bad_notify_setting_and_ping_url_is_one_problem_naming_it() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(BAD, "jobs.toml", {})
    problems = raised.value.problems
    assert problems == [
        "jobs.toml: [notify]: unknown setting 'evnts' (did you mean 'events'?)",
        "jobs.toml: [notify]: attempts: must be a whole number of at least 1, not 0",
        "jobs.toml: [notify]: timeout: 'soon' is not a duration: write a number and a unit "
        '(ms, s, m, h, d), such as "90s", "10m" or "1h30m"',
        "jobs.toml: job 'nightly': ping_url: must be an http:// or https:// URL, not no "
        "scheme ('***')",
    ]
    fixed = BAD.replace("evnts", "# evnts").replace("attempts = 0", "").replace('"soon"', "5")
    with pytest.raises(ConfigError) as again:
        parse_config(fixed.replace("hc-ping.com/", "https://hc-ping.com/"), "jobs.toml", {})
    assert again.value.problems == [
        "jobs.toml: [notify]: url: must be an http:// or https:// URL, not ftp:// "
        "('ftp://example.com/***')"
    ]
    assert "SECRET" not in "\n".join(problems + again.value.problems)


def test_notify_needs_a_url() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config('[notify]\nevents = ["failed"]\n', "jobs.toml", {})
    assert raised.value.problems == [
        'jobs.toml: [notify]: needs a url = "https://..." to post alerts to'
    ]


def test_check_reports_a_bad_notify_table(tmp_path: Path) -> None:
    path = write(tmp_path, BAD.replace("attempts = 0", "attempts = 2"))
    result = replicron("check", str(path))
    assert result.returncode == 2
    assert "[notify]: unknown setting 'evnts'" in result.stdout + result.stderr
    assert "ping_url: must be an http:// or https:// URL" in result.stdout + result.stderr
    assert "SECRET" not in result.stdout + result.stderr
    good = write(
        tmp_path,
        GOOD.replace("${HOOK_TOKEN}", "x")
        .replace("${API_TOKEN}", "y")
        .replace("${PING_UUID}", "z"),
        "good.toml",
    )
    assert replicron("check", str(good)).returncode == 0


def test_a_reload_that_changes_the_alerts_replaces_the_notifier_and_its_metrics() -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    async def main(receiver: Receiver) -> CollectorRegistry:
        clock = FakeClock(START)
        scheduler = AsyncScheduler(clock=clock, replica_id="d1")
        scheduler.add_job(every(seconds=10), broken, name="etl")
        registry = CollectorRegistry()
        alerts = Alerts(scheduler, "", registry)
        first = NotifyConfig({"url": receiver.url("/one")})
        alerts.apply(first, [])
        await alerts.reload(NotifyConfig({"url": receiver.url("/one")}), [])  # the same: kept
        await alerts.reload(
            NotifyConfig({"url": receiver.url("/two")}), [("etl", receiver.url("/ping"))]
        )
        await scheduler.start()
        await asyncio.to_thread(clock.wait_for_sleepers, 1)
        clock.set(START + timedelta(seconds=10))
        await asyncio.to_thread(receiver.wait_for, 3)
        await scheduler.shutdown()
        return registry

    with receiving() as receiver:
        registry = asyncio.run(main(receiver))
        paths = sorted(r.path for r in receiver.received)
    assert paths == ["/ping/fail", "/ping/start", "/two"]
    sent = registry.get_sample_value("replicron_notifications_total", {"result": "sent"})
    assert sent == 3  # the new notifier's: the old one's series went with it


def test_notify_jobs_and_tags_name_jobs_of_the_config() -> None:
    text = GOOD.replace(
        'tags = "critical"', 'jobs = ["nightly", "nigthly-report"]\ntags = "critcal"'
    )
    text += '\n[[job]]\nname = "nightly-report"\nevery = "1h"\ncommand = ["true"]\n'
    text += 'tags = ["critical"]\n'
    with pytest.raises(ConfigError) as raised:
        parse_config(text, "jobs.toml", ENV)
    # A name misspelt there would silence the job's alerts for good.
    assert raised.value.problems == [
        "jobs.toml: [notify]: jobs: no job is named 'nigthly-report' (did you mean "
        "'nightly-report'?)",
        "jobs.toml: [notify]: tags: no job has the tag 'critcal' (did you mean 'critical'?)",
    ]
    fixed = text.replace("nigthly-report", "nightly-report").replace("critcal", "critical")
    assert parse_config(fixed, "jobs.toml", ENV).notify is not None
