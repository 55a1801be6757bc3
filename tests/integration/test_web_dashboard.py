"""The dashboard in a real browser (headless Chromium driven by Playwright, the system's
``chromium``: .ci/run installs it), against ``timers web`` serving a real server with real
timers. Each page's screenshot is saved in the test's temporary directory, or under docs/
for the docs with ``TIMERS_SCREENSHOTS=docs`` (so a test run leaves the checkout clean)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from playwright.sync_api import expect
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes, runs
from tests.task_pkg.fail import HEALED
from tests.task_pkg.slow import RELEASE
from timers import Timers, TimerSpec
from timers.dev.server import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.integration, pytest.mark.one_server,
              pytest.mark.skipif(CHROMIUM is None,
                                 reason="no chromium binary (.ci/run installs Debian's)")]
TOKEN = "dashboard-test-token"
HOSTILE_ID = "<script>alert(1)</script>"
SHOTS = ROOT / "docs" if os.environ.get("TIMERS_SCREENSHOTS") == "docs" else None


def answers(url: str) -> Callable[[], bool]:
    def up() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            return False
    return up


def serve(processes: Processes, redis_url: str, *extra: str) -> str:
    port = free_port()
    processes.spawn(TIMERS_COMMAND, "web", "--url", redis_url, "--port", str(port), *extra)
    base = f"http://127.0.0.1:{port}"
    wait_until(answers(base + "/"), 20, message="timers web to answer")
    return base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    opened = context.new_page()
    dialogs: list[str] = []
    opened.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    opened.dialogs = dialogs
    console: list[str] = []
    opened.on("console", lambda m: console.append(m.text))
    opened.console = console
    yield opened
    context.close()


def shot(page: Any, name: str, selector: str | None = None) -> None:
    """Save the page (or the element ``selector``) as ``dashboard-<name>.png``."""
    where = SHOTS or Path(tempfile.gettempdir()) / "timers-dashboard-shots"
    where.mkdir(exist_ok=True)
    path = str(where / f"dashboard-{name}.png")
    if selector is None:
        page.screenshot(path=path, full_page=True)
    else:
        page.locator(selector).screenshot(path=path)


def log_in(page: Any, base: str) -> None:
    page.goto(base + "/login")
    page.fill("#token", TOKEN)
    page.click("#login")
    page.wait_for_url(base + "/")


def test_the_overview_shows_the_counts_and_refreshes_itself(
        redis_url: str, r: redis.Redis, processes: Processes, page: Any) -> None:
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 1, 20, message="a listener")
        t.schedule_many(TimerSpec("record.hit", [i], in_=0.2) for i in range(20))
        wait_until(lambda: len(runs(r)) == 20, 20, message="20 timers to fire")
        t.schedule_many([TimerSpec("reminders.sms", [i], in_=30) for i in range(5)]
                        + [TimerSpec("reminders.sms", [i], in_=-5, group="nobody")
                           for i in range(2)])
        base = serve(processes, redis_url, "--auth", TOKEN)
        page.goto(base + "/")
        assert page.url == base + "/login"  # every page needs the login
        log_in(page, base)
        assert page.inner_text("#pending") == "7"
        assert page.inner_text("#due-minute") == "5" and page.inner_text("#overdue") == "2"
        t.schedule("reminders.sms", [9], in_=600)
        # no reload: the page's own script fetched the figures, its CSP nonce let it run
        # (a locator, not wait_for_function: that evaluates a string, which the CSP forbids)
        expect(page.locator("#pending")).to_have_text("8", timeout=10_000)
        listeners = page.inner_text("#listeners")
        assert t.listeners()[0]["id"] in listeners and "ago" in listeners
        assert not [m for m in page.console if "Content Security Policy" in m]
    scrape = urllib.request.Request(base + "/metrics",
                                    headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(scrape, timeout=5) as reply:  # one scrape target
        text = reply.read().decode()
    pending = {s.labels["group"]: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "timers_pending"}
    assert pending == {"default": 6, "nobody": 2}


def test_search_finds_a_timer_by_id_prefix(redis_url: str, processes: Processes,
                                           page: Any) -> None:
    with Timers(redis_url) as t:
        for timer_id in ("order-1234", "order-5678", "user-1"):
            t.schedule("reminders.sms", [timer_id], in_=600, id=timer_id)
    base = serve(processes, redis_url)
    page.goto(base + "/timers")
    page.fill("#search", "order-12")
    page.press("#search", "Enter")
    page.wait_for_url("**/timers?q=order-12*")
    table = page.inner_text("#pending-timers")
    assert "order-1234" in table and "order-5678" not in table and "user-1" not in table


def test_cancel_from_the_timer_page_removes_it_from_redis(
        redis_url: str, r: redis.Redis, processes: Processes, page: Any) -> None:
    with Timers(redis_url) as t:
        t.schedule("reminders.sms", {"user_id": 42}, in_=600, id="to-cancel")
        base = serve(processes, redis_url, "--auth", TOKEN)
        log_in(page, base)
        page.goto(base + "/timer?id=to-cancel")
        shot(page, "timer")
        page.click("#cancel")
        expect(page.locator("#timer-status")).to_have_text("cancelled")
        assert t.get("to-cancel") is None
        assert not r.hexists("timers|rec", "to-cancel") and r.zscore("timers|due",
                                                                      "to-cancel") is None


def test_a_completed_a_dead_and_a_cancelled_timer_each_have_a_page(
        redis_url: str, r: redis.Redis, processes: Processes, page: Any) -> None:
    """Ended timers open from History and Dead (ids are links), each page from its history
    and failure records: how it ended, when, how late, where; the dead one's error with its
    traceback and a Retry that schedules it again; an unknown id answers 404."""
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        t.schedule("record.hit", ["welcome"], in_=0.5, id="signup-42:welcome")
        t.schedule("fail.until_healed", ["refund"], in_=0.5, id="refund-1001")
        t.schedule("reminders.sms", {"user_id": 7}, in_=3600, id="sms:7")
        assert t.cancel("sms:7")
        wait_until(lambda: t.stats().failed == 1 and len(runs(r)) == 1, 20,
                   message="one timer to complete and one to die")
        base = serve(processes, redis_url, "--auth", TOKEN)
        log_in(page, base)
        page.goto(base + "/history")
        page.click("#history >> text=signup-42:welcome")
        expect(page.locator("#timer-status")).to_have_text("completed")
        fields = page.inner_text("#timer-fields")
        assert "record.hit" in fields and "start after its due time" in fields
        assert t.listeners()[0]["id"] in fields
        shot(page, "timer-completed")
        page.goto(base + "/dead")
        page.click("#dead-timers >> text=refund-1001")
        expect(page.locator("#timer-status")).to_have_text("dead")
        assert "TaskBroke" in page.inner_text("#timer-error")
        assert "not healed yet refund" in page.inner_text("#traceback")
        shot(page, "timer-dead")
        page.goto(base + "/timers?q=sms:7")
        page.click("#search-ended a")
        expect(page.locator("#timer-status")).to_have_text("cancelled")
        assert page.locator("#cancel").count() == 0
        shot(page, "timer-cancelled")
        r.set(HEALED, 1)
        page.goto(base + "/timer?id=refund-1001")
        page.click("#retry")
        expect(page.locator("#said")).to_contain_text("scheduled again")
        wait_until(lambda: t.status("refund-1001").state.value == "completed", 20,
                   message="the retried timer to complete")
        reply = page.goto(base + "/timer?id=never-was")
        assert reply is not None and reply.status == 404
        assert page.dialogs == []


def test_the_login_link_timers_web_prints_logs_in_once(
        redis_url: str, processes: Processes, page: Any, browser: Any) -> None:
    """The documented start (the token in $TIMERS_WEB_TOKEN, made by openssl) prints a
    one-time link: it logs this browser in, and no other."""
    env = {**processes.env(), "TIMERS_WEB_TOKEN": TOKEN}
    port = free_port()
    processes.spawn(TIMERS_COMMAND, "web", "--url", redis_url, "--port", str(port), env=env)
    base = f"http://127.0.0.1:{port}"
    wait_until(answers(base + "/login"), 20, message="timers web to answer")
    log = processes.started[-1][1]
    wait_until(lambda: "log in: open" in log.read_text(), 10, message="the login line")
    line = next(x for x in log.read_text().splitlines() if x.startswith("log in: open"))
    assert "the token from $TIMERS_WEB_TOKEN" in line
    link = line.split()[3]
    assert link.startswith(base + "/login?code=")
    page.goto(link)
    assert page.url == base + "/"
    other = browser.new_context().new_page()
    other.goto(link)
    assert other.url.startswith(base + "/login") and other.locator("#wrong-token").count() == 1
    other.context.close()


def test_retry_of_a_dead_timer_makes_it_fire(redis_url: str, r: redis.Redis,
                                             processes: Processes, page: Any) -> None:
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        t.schedule("fail.until_healed", ["healed"], in_=0, id="fragile")
        wait_until(lambda: t.stats().failed == 1, 20, message="the timer to die")
        base = serve(processes, redis_url, "--auth", TOKEN)
        log_in(page, base)
        page.goto(base + "/dead")
        assert "not healed yet" in page.inner_text("#dead-timers")
        shot(page, "dead")
        r.set(HEALED, 1)  # the bug is fixed: retry it
        page.click("button.retry")
        page.wait_for_selector("#said")
    wait_until(lambda: [run[0] for run in runs(r)] == ["healed"], 20,
               message="the retried timer to fire on the listener")


def test_a_hostile_id_renders_as_text_and_runs_no_script(
        redis_url: str, processes: Processes, page: Any) -> None:
    with Timers(redis_url) as t:
        t.schedule("reminders.sms", {"note": "<img src=x onerror=alert(2)>"}, in_=600,
                   id=HOSTILE_ID)
        t.every("nightly-report", "reminders.sms", [1], cron="0 3 * * *")
    r = redis.Redis.from_url(redis_url)
    r.zadd("timers|listeners", {"forged": 2 ** 50})  # another app wrote junk there
    r.hset("timers|listener", "forged", json.dumps(
        {"id": "<b>forged</b>", "groups": 5, "running": "<i>", "busiest_tasks": "x"}))
    base = serve(processes, redis_url)
    page.goto(base + "/")
    assert "<b>forged</b>" in page.inner_text("#listeners")
    page.goto(base + "/timers")
    page.click(f"text={HOSTILE_ID}")
    assert page.inner_text("#timer-id") == HOSTILE_ID
    assert "<img src=x onerror=alert(2)>" in page.inner_text("#args")
    page.goto(base + "/recurrences")
    assert HOSTILE_ID not in page.content()  # (as markup: only escaped)
    assert page.dialogs == []


def test_an_action_without_the_token_is_refused_and_changes_nothing(
        redis_url: str, processes: Processes, page: Any) -> None:
    with Timers(redis_url) as t:
        t.schedule("reminders.sms", [1], in_=600, id="kept")
        base = serve(processes, redis_url, "--auth", TOKEN)
        page.goto(base + "/timer?id=kept")
        assert page.url == base + "/login"  # not logged in: not even the page
        refused = page.request.post(base + "/act", form={"action": "cancel", "id": "kept"})
        assert refused.status == 403
        log_in(page, base)  # logged in, but a forged form without the CSRF token
        forged = page.request.post(base + "/act", form={"action": "cancel", "id": "kept"})
        assert forged.status == 403
        assert t.get("kept") is not None


def test_read_only_shows_no_buttons_and_refuses_every_action(
        redis_url: str, processes: Processes, page: Any) -> None:
    with Timers(redis_url) as t:
        t.schedule("reminders.sms", [1], in_=600, id="kept")
        base = serve(processes, redis_url, "--read-only", "--auth", TOKEN)
        page.goto(base + "/login")
        assert "read-only" in page.inner_text("main")
        log_in(page, base)  # the token lets one look
        page.goto(base + "/timer?id=kept")
        assert page.inner_text("#timer-id") == "kept"
        assert page.locator("button").count() == 0
        for action in ("cancel", "run_now", "purge"):
            reply = page.request.post(base + "/act", form={"action": action, "id": "kept"})
            assert reply.status == 403
        assert t.get("kept") is not None


def test_the_dashboard_binds_to_localhost_by_default() -> None:
    done = subprocess.run([TIMERS_COMMAND, "web", "--help"], capture_output=True, text=True,
                          check=False)
    assert "127.0.0.1" in done.stdout





def test_the_charts_have_axes_units_and_fill_in_as_runs_end(
        redis_url: str, processes: Processes, page: Any) -> None:
    """The overview's three charts (runs and failures per minute over the last hour, per
    15 minutes over the last day, lateness p50/p99 on one scale), fed by the run
    history."""
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 1, 20, message="a listener")
        base = serve(processes, redis_url)
        page.goto(base + "/")
        for chart, unit in (("chart-hour", "runs / min"), ("chart-day", "runs / 15 min"),
                            ("chart-lateness", "ms")):
            svg = page.locator(f"#{chart}")
            assert svg.locator("text.unit").text_content() == unit
            assert svg.locator("text.tick").count() >= 4  # values and times on the axes
        t.schedule_many(TimerSpec("record.hit", [i], in_=0.1) for i in range(30))
        t.schedule_many(TimerSpec("fail.boom", [i], in_=0.1) for i in range(3))
        # the page refreshes itself and shows the runs as they end
        expect(page.locator("#chart-hour rect.bar.series-runs").first).to_be_visible(
            timeout=30_000)
        expect(page.locator("#chart-hour rect.bar.series-failures").first).to_be_visible(
            timeout=30_000)
        expect(page.locator("#chart-lateness polyline.series-p99, "
                            "#chart-lateness circle.series-p99").first).to_be_attached(
            timeout=30_000)
        assert float(page.inner_text("#fired-per-minute")) > 0
        assert "-" not in page.inner_text("#fired-per-minute")
        assert "From the run history" in page.inner_text("#charts-note")
        assert "flow.keyed" in page.inner_text("#tasks")  # the tasks the listener runs
        shot(page, "overview")
        shot(page, "charts", ".charts")
        assert not [m for m in page.console if "Content Security Policy" in m]


def test_the_pending_page_shows_every_group_priority_and_held_back_timer(
        redis_url: str, r: redis.Redis, processes: Processes, page: Any) -> None:
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 1, 20, message="a listener")
        t.schedule("reminders.sms", {"user_id": 42, "text": "your code is 1234"}, in_=600,
                   id="sms-42")
        t.schedule("reminders.sms", [7], in_=300, group="billing", priority=5, id="bill-7")
        t.schedule_many(TimerSpec("flow.keyed", [f"k{i}", "dev:1", -1], key="dev:1", in_=0,
                                  id=f"keyed-{i}") for i in range(3))
        wait_until(lambda: len([x for x in t.list() if x.wait is not None]) == 2, 20,
                   message="two timers waiting for key dev:1")
        base = serve(processes, redis_url)
        try:
            page.goto(base + "/timers")
            rows = page.locator("#pending-timers tr")
            table = page.inner_text("#pending-timers")
            assert "sms-42" in table and "bill-7" in table  # every group, every priority
            assert '"text":"your code is 1234"' in table and "billing\t5" in table
            assert table.count("waiting for key dev:1") == 2 and "dev:1" in table
            assert rows.count() == 1 + 4
            queues = page.inner_text("#queues")
            assert "billing" in queues and "held back" in queues
            shot(page, "pending")
            page.click("#queues >> text=billing")
            page.wait_for_url("**/timers?group=billing")
            assert page.locator("#pending-timers tr").count() == 2
            assert "bill-7" in page.inner_text("#pending-timers")
        finally:
            r.set(RELEASE, 1)


def test_a_task_page_shows_its_limits_what_waits_its_runs_and_failures(
        redis_url: str, r: redis.Redis, processes: Processes, page: Any) -> None:
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 1, 20, message="a listener")
        t.schedule_many(TimerSpec("flow.keyed", [f"k{i}", "dev:1", -1], key="dev:1", in_=0,
                                  id=f"keyed-{i}") for i in range(3))
        t.schedule("fail.boom", ["broken"], in_=0, id="broken-1")
        wait_until(lambda: len([x for x in t.list() if x.wait is not None]) == 2, 20,
                   message="two timers waiting for key dev:1")
        base = serve(processes, redis_url, "--auth", TOKEN)
        try:
            log_in(page, base)
            page.goto(base + "/task?name=flow.keyed")
            assert page.inner_text("#task-name") == "flow.keyed"
            limits = page.inner_text("#limits")
            assert "concurrency key\tdev:1\t1 at once\t1\t2\t2" in limits, limits
            assert page.locator("#task-running tr").count() == 2  # one run holds the slot
            assert page.inner_text("#task-pending").count("waiting for key dev:1") == 2
            assert page.locator("#task-runs").count() == 1
            shot(page, "task")
        finally:
            r.set(RELEASE, 1)
        wait_until(lambda: t.stats().failed == 1, 20, message="fail.boom to die")
        page.goto(base + "/task?name=fail.boom")
        assert "broken-1" in page.inner_text("#task-failures")
        page.goto(base + "/task?name=no.such.task")
        assert "no such task" in page.inner_text("body")


def test_the_history_page_shows_the_runs_and_filters_the_failed_ones(
        redis_url: str, processes: Processes, page: Any) -> None:
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg")
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 1, 20, message="a listener")
        t.schedule("record.hit", ["once"], in_=0)
        t.schedule("fail.boom", ["broken"], in_=0)
        wait_until(lambda: t.stats().failed == 1, 20, message="fail.boom to die")
        base = serve(processes, redis_url)
        page.goto(base + "/history")
        table = page.inner_text("#history")
        assert "record.hit" in table and "fail.boom" in table
        page.check("input[name=failed]")
        page.click("text=Show")
        page.wait_for_url("**/history?*failed=1*")
        assert "record.hit" not in page.inner_text("#history")
        shot(page, "history")


def test_recurrences_show_their_interval_next_run_and_state(
        redis_url: str, processes: Processes, page: Any) -> None:
    with Timers(redis_url) as t:
        t.every("heartbeat-check", "record.hit", ["beat"], interval=3600)
        t.every("nightly-report", "record.hit", ["report"], cron="0 3 * * *")
        t.every("paused-one", "record.hit", ["p"], interval=90)
        t.pause("paused-one")
    base = serve(processes, redis_url)
    page.goto(base + "/recurrences")
    rows = {row.split("\t")[0]: row.split("\t") for row in
            page.inner_text("#recurrences").split("\n")[1:]}
    assert rows["heartbeat-check"][2] == "every 1h"
    assert rows["heartbeat-check"][5] == "waiting"
    assert rows["heartbeat-check"][3].startswith(("in 1h", "in 59m"))
    assert rows["nightly-report"][3].startswith("in ") and rows["nightly-report"][5] == "waiting"
    assert rows["nightly-report"][2] == "cron 0 3 * * * (UTC)"
    assert rows["paused-one"][2] == "every 1m 30s" and rows["paused-one"][5] == "paused"
    shot(page, "recurrences")
