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
from timers import Timers, TimerSpec
from timers.server import free_port

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


def shot(page: Any, name: str) -> None:
    where = SHOTS or Path(tempfile.gettempdir()) / "timers-dashboard-shots"
    where.mkdir(exist_ok=True)
    page.screenshot(path=str(where / f"dashboard-{name}.png"), full_page=True)


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
    shot(page, "overview")


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
    page.goto(base + "/timers")
    shot(page, "pending")


def test_cancel_from_the_timer_page_removes_it_from_redis(
        redis_url: str, r: redis.Redis, processes: Processes, page: Any) -> None:
    with Timers(redis_url) as t:
        t.schedule("reminders.sms", {"user_id": 42}, in_=600, id="to-cancel")
        base = serve(processes, redis_url, "--auth", TOKEN)
        log_in(page, base)
        page.goto(base + "/timer?id=to-cancel")
        shot(page, "timer")
        page.click("#cancel")
        page.wait_for_selector("#not-pending")
        assert t.get("to-cancel") is None
        assert not r.hexists("timers|rec", "to-cancel") and r.zscore("timers|due",
                                                                      "to-cancel") is None


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
    shot(page, "recurrences")
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



