"""The one-time login link ``timers web`` prints (Starlette's TestClient over fakeredis):
it logs one browser in, once, within its time; a used, expired or wrong code logs nobody in
and backs the client off as a wrong token does; the printed line names the link and where
the token comes from."""

from __future__ import annotations

import fakeredis
import pytest
from starlette.testclient import TestClient

from timers import Timers
from timers.cli.web import login_line
from timers.web.app import create_app
from timers.web.auth import COOKIE, LOGIN_LINK_S, Backoff, Guard

TOKEN = "s3cret-token"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timers(fake: fakeredis.FakeRedis) -> Timers:
    t = Timers(fake)
    t.warn_in_event_loop = False
    t.schedule("reminders.sms", [1], in_=600, id="kept")
    return t


def browser(t: Timers, guard: Guard) -> TestClient:
    return TestClient(create_app(t, guard), base_url="http://127.0.0.1:8080",
                      follow_redirects=False)


def test_the_link_logs_one_browser_in_once(timers: Timers) -> None:
    guard = Guard(token=TOKEN)
    code = guard.login_code()
    first = browser(timers, guard)
    assert first.get("/timer?id=kept").status_code == 303  # not logged in yet
    opened = first.get(f"/login?code={code}")
    assert (opened.status_code, opened.headers["location"]) == (303, "/")
    assert COOKIE in opened.cookies
    assert first.get("/timer?id=kept").status_code == 200
    second = browser(timers, guard)  # the same link again: used up
    again = second.get(f"/login?code={code}")
    assert again.status_code == 403 and 'id="wrong-token"' in again.text
    assert COOKIE not in again.cookies and code not in again.text
    assert second.get("/timer?id=kept").status_code == 303


def test_an_expired_or_wrong_code_logs_nobody_in_and_backs_off(timers: Timers) -> None:
    clock = Clock()
    guard = Guard(token=TOKEN, backoff=Backoff(clock=clock))
    code = guard.login_code()
    clock.now += LOGIN_LINK_S + 1
    c = browser(timers, guard)
    assert c.get(f"/login?code={code}").status_code == 403
    assert c.get("/login?code=guessed").status_code == 429  # backed off: not looked at
    clock.now += 2
    assert c.get("/login?code=guessed").status_code == 403
    clock.now += 10
    fresh = guard.login_code()
    assert c.get(f"/login?code={fresh}").status_code == 303


def test_a_dashboard_without_a_token_has_no_link() -> None:
    with pytest.raises(ValueError, match="needs a token"):
        Guard(token=None).login_code()
    assert Guard(token=None).cookie_for_code("anything", "x") is None


def test_the_printed_line_names_the_link_and_the_token_s_source() -> None:
    line = login_line("0.0.0.0", 8080, "abc", "$TIMERS_WEB_TOKEN", LOGIN_LINK_S)
    assert line == ("log in: open http://127.0.0.1:8080/login?code=abc (works once, within "
                    "15 min), or enter the token from $TIMERS_WEB_TOKEN at "
                    "http://127.0.0.1:8080/login")
    assert "http://[::1]:9/login?code=x " in login_line("::", 9, "x", "--auth", 60)
    assert "http://10.0.0.5:80/login" in login_line("10.0.0.5", 80, "x", "--auth", 60)
