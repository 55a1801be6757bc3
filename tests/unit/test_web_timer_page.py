"""Every timer has a page on the dashboard (Starlette's TestClient over fakeredis, a burst
listener ending the timers): a completed, a dead and a cancelled timer's page says how it
ended, with the history record's times and the dead one's error and traceback; the dead one
can be retried from it; an unknown id is a 404 that repeats nothing; ids are links on the
History, Dead and task pages, and the search finds an ended timer by its whole id."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

import fakeredis
import pytest
from starlette.testclient import TestClient

from tests.unit.helpers import run_burst
from timers import Listener, Timers
from timers.web.app import create_app
from timers.web.auth import Guard

TOKEN = "s3cret-token"
PAST = datetime(2001, 1, 1, tzinfo=UTC)
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def ended(server: fakeredis.FakeServer) -> Iterator[tuple[Timers, Listener]]:
    """``ok`` completed, ``dead`` dead (ValueError), ``off`` cancelled, ``later`` pending."""
    with Timers(fakeredis.FakeRedis(server=server)) as t:
        t.warn_in_event_loop = False
        t.schedule("mod.add", [1, 2], at=PAST, id="ok")
        t.schedule("mod.boom", ["the <b>bad</b> input"], at=PAST, id="dead")
        t.schedule("mod.add", [1], in_=3600, id="off")
        t.schedule("mod.add", [5], in_=3600, id="later")
        assert t.cancel("off")
        listener = run_burst(server)
        yield t, listener


def client(t: Timers, token: str | None = TOKEN) -> TestClient:
    c = TestClient(create_app(t, Guard(token=token)), base_url="http://127.0.0.1:8080",
                   follow_redirects=False)
    if token is not None:
        assert c.post("/login", data={"token": token}).status_code == 303
    return c


def fields(html: str) -> dict[str, str]:
    """The page's ``<th>…</th><td>…</td>`` rows, tags stripped."""
    rows = re.findall(r"<tr><th>(.*?)</th><td[^>]*>(.*?)</td></tr>", html, re.S)
    return {k: re.sub(r"<[^>]+>", "", v).strip() for k, v in rows}


def test_a_completed_timer_s_page_says_when_where_how_late(
        ended: tuple[Timers, Listener]) -> None:
    t, listener = ended
    page = client(t).get("/timer?id=ok")
    assert page.status_code == 200
    assert re.search(r'id="timer-status"[^>]*>completed<', page.text)
    shown = fields(page.text)
    record = t.status("ok").ended
    assert record is not None
    assert shown["task"] == "mod.add" and shown["attempts"] == "1"
    assert shown["listener"] == listener.id
    assert shown["ended"].startswith(datetime.fromtimestamp(record.ended, UTC)
                                     .strftime("%Y-%m-%d %H:%M:%S"))
    assert shown["lateness"].endswith("ms (start after its due time)")  # 2001: years late
    assert float(shown["lateness"].split(" ")[0].replace(",", "")) > 1e11
    assert 'id="retry"' not in page.text and 'id="no-rerun"' in page.text


def test_a_dead_timer_s_page_shows_its_error_traceback_args_and_retries(
        ended: tuple[Timers, Listener]) -> None:
    t, _ = ended
    c = client(t)
    page = c.get("/timer?id=dead")
    assert page.status_code == 200
    assert re.search(r'id="timer-status"[^>]*>dead<', page.text)
    shown = fields(page.text)
    assert shown["task"] == "mod.boom"
    assert "ValueError: the &lt;b&gt;bad&lt;/b&gt; input" in shown["error"]  # escaped
    assert "<b>bad</b>" not in page.text
    traceback = re.search(r'<pre id="traceback">(.*?)</pre>', page.text, re.S)
    assert traceback and "Traceback (most recent call last)" in traceback.group(1)
    assert "raise ValueError(message)" in traceback.group(1)
    assert "the &lt;b&gt;bad&lt;/b&gt; input" in shown["args"]
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    failure_id = re.search(r'name="failure_id" value="([^"]+)"', page.text)
    assert csrf and failure_id and 'name="back" value="timer"' in page.text
    done = c.post("/act", data={"action": "retry", "id": "dead", "back": "timer",
                                "failure_id": failure_id.group(1), "csrf": csrf.group(1)})
    assert (done.status_code, done.headers["location"]) == (303, "/timer?id=dead")
    again = c.get(done.headers["location"])
    assert re.search(r'id="timer-status"[^>]*>(pending|waiting)<', again.text)  # due now
    assert "scheduled again, due now" in again.text
    assert t.get("dead") is not None and t.get("dead").args == ["the <b>bad</b> input"]


def test_a_dead_timer_cannot_be_retried_without_the_csrf_token_or_when_read_only(
        ended: tuple[Timers, Listener]) -> None:
    t, _ = ended
    failure_id = t.get_failures("dead")[0].failure_id
    refused = client(t).post("/act", data={"action": "retry", "id": "dead",
                                           "failure_id": failure_id})
    assert refused.status_code == 403 and t.get("dead") is None
    read_only = TestClient(create_app(t, Guard(token=None)), base_url="http://127.0.0.1:8080")
    assert 'id="retry"' not in read_only.get("/timer?id=dead").text


def test_a_cancelled_timer_s_page_says_who_cancelled_it(
        ended: tuple[Timers, Listener]) -> None:
    t, _ = ended
    page = client(t).get("/timer?id=off")
    assert page.status_code == 200
    assert re.search(r'id="timer-status"[^>]*>cancelled<', page.text)
    shown = fields(page.text)
    record = t.status("off").ended
    assert record is not None and record.listener
    assert shown["cancelled by"] == record.listener and shown["task"] == "mod.add"
    assert shown["ran"] == "-" and 'id="cancel"' not in page.text


def test_a_pending_timer_s_page_keeps_its_actions(ended: tuple[Timers, Listener]) -> None:
    t, _ = ended
    page = client(t).get("/timer?id=later")
    assert page.status_code == 200
    assert re.search(r'id="timer-status"[^>]*>pending<', page.text)
    assert all(f'id="{b}"' in page.text for b in ("cancel", "run-now", "reschedule"))


@pytest.mark.parametrize("timer_id", ["never-was", "Call555-0100", "bad\x00id", "x" * 5000])
def test_an_unknown_id_is_a_404_that_repeats_nothing(
        ended: tuple[Timers, Listener], timer_id: str) -> None:
    page = client(t := ended[0]).get("/timer", params={"id": timer_id})
    assert page.status_code == 404 and 'id="not-pending"' in page.text
    assert timer_id[:8] not in page.text.replace("not-pending", "")
    assert t.get("later") is not None


def test_ids_are_links_on_history_dead_and_task_pages(ended: tuple[Timers, Listener]) -> None:
    t, _ = ended
    c = client(t)
    history = c.get("/history").text
    assert all(f'<a href="/timer?id={i}">{i}</a>' in history for i in ("ok", "dead", "off"))
    assert '<a href="/timer?id=dead">dead</a>' in c.get("/dead").text
    task = c.get("/task?name=mod.boom").text
    assert task.count('<a href="/timer?id=dead">dead</a>') == 2  # its runs and its failures


def test_the_search_finds_an_ended_timer_by_its_whole_id(
        ended: tuple[Timers, Listener]) -> None:
    t, _ = ended
    c = client(t)
    found = c.get("/timers?q=ok").text
    assert re.search(r'id="search-ended">Timer <a href="/timer\?id=ok">ok</a> is not pending: '
                     r"<b>completed</b>", found)
    assert 'id="search-ended"' not in c.get("/timers?q=later").text  # pending: in the table
    assert 'id="search-ended"' not in c.get("/timers?q=never-was").text
    assert 'id="search-ended"' not in c.get("/timers?q=o").text  # a prefix: pending only


def test_a_hostile_ended_id_is_escaped_on_every_page_that_shows_it(
        server: fakeredis.FakeServer) -> None:
    with Timers(fakeredis.FakeRedis(server=server)) as t:
        t.warn_in_event_loop = False
        t.schedule("mod.boom", [HOSTILE], at=PAST, id=HOSTILE)
        t.schedule("mod.add", [1], in_=600, id=HOSTILE + "2")
        assert t.cancel(HOSTILE + "2")
        run_burst(server)
        c = client(t, token=None)
        for path in ("/timer", "/timers", "/history", "/dead", "/task"):
            for params in ({"id": HOSTILE}, {"id": HOSTILE + "2"}, {"q": HOSTILE},
                           {"name": "mod.boom"}):
                page = c.get(path, params=params)
                assert "<script>alert" not in page.text, (path, params)
        page = c.get("/timer", params={"id": HOSTILE})
        assert page.status_code == 200
        assert '<span id="timer-id">&lt;script&gt;alert(1)&lt;/script&gt;</span>' in page.text
        assert 'href="/timer?id=%3Cscript%3Ealert%281%29%3C/script%3E"' in c.get("/dead").text


def test_a_heartbeat_another_writer_mangled_does_not_break_a_timer_s_page(
        ended: tuple[Timers, Listener], server: fakeredis.FakeServer) -> None:
    t, _ = ended
    fake = fakeredis.FakeRedis(server=server)
    fake.zadd("timers|listeners", {"forged": 2 ** 50})
    fake.hset("timers|listener", "forged", '{"id": "<b>forged</b>", "groups": 5}')
    assert t.status("later").state.value == "pending"  # (was: TypeError, int not iterable)
    assert client(t).get("/timer?id=later").status_code == 200
