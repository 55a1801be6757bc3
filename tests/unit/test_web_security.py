"""The dashboard as an attacker meets it (Starlette's TestClient over fakeredis): the login
on every page, the Host allowlist, the security headers, no notice from the query string,
malformed input answered 4xx, and errors that say what they are."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator

import fakeredis
import pytest
import redis
from starlette.testclient import TestClient

from timers import Timers
from timers.cli.listen import listen as listen_command
from timers.cli.observe import metrics as metrics_command
from timers.cli.web import web as web_command
from timers.dev.server import free_port
from timers.web.app import create_app
from timers.web.auth import COOKIE, NOTE_COOKIE, Backoff, Guard
from timers.web.security import allowed_hosts, host_name

TOKEN = "s3cret-token"
BASE = "http://127.0.0.1:8080"
PAGES = ["/", "/timers", "/timers?group=default&priority=0", "/timer?id=kept", "/dead",
         "/recurrences", "/task?name=reminders.sms", "/history"]
MARK = "Call555-0100"
"""Words a link might try to put on a page."""


@pytest.fixture
def timers(fake: fakeredis.FakeRedis) -> Iterator[Timers]:
    with Timers(fake) as t:
        t.warn_in_event_loop = False
        t.schedule("reminders.sms", {"user_id": 42}, in_=600, id="kept")
        yield t


def client(t: Timers, token: str | None = TOKEN, guard: Guard | None = None,
           address: str = "testclient", **options: object) -> TestClient:
    app = create_app(t, guard or Guard(token=token), **options)  # type: ignore[arg-type]
    return TestClient(app, base_url=BASE, follow_redirects=False, client=(address, 50000))


def log_in(c: TestClient) -> None:
    assert c.post("/login", data={"token": TOKEN}).status_code == 303


def csrf(c: TestClient, path: str = "/timer?id=kept") -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', c.get(path).text)
    assert found, "the page has a form with a CSRF token"
    return found.group(1)


# -- the login -------------------------------------------------------------------------


def test_with_a_token_every_page_live_and_metrics_need_the_login(timers: Timers) -> None:
    c = client(timers)
    for path in PAGES:
        reply = c.get(path)
        assert (reply.status_code, reply.headers["location"]) == (303, "/login"), path
        assert "reminders.sms" not in reply.text
    for path in ("/live", "/metrics"):
        reply = c.get(path)
        assert reply.status_code == 401 and "--auth" in reply.text, path
        assert "timers_pending" not in reply.text
    assert c.post("/act", data={"action": "cancel", "id": "kept"}).status_code == 403
    assert c.get("/login").status_code == 200  # the one page open to all
    scrape = c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert scrape.status_code == 200 and "timers_pending" in scrape.text
    assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    c = client(timers)  # (a new dashboard: that wrong token backed this client off)
    log_in(c)
    for path in [*PAGES, "/live", "/metrics"]:
        assert c.get(path).status_code == 200, path
    assert timers.get("kept") is not None


def test_read_only_with_a_token_needs_the_login_to_look_and_refuses_actions(
        timers: Timers) -> None:
    c = TestClient(create_app(timers, Guard(token=TOKEN, read_only=True)), base_url=BASE,
                   follow_redirects=False)
    assert c.get("/timer?id=kept").status_code == 303
    log_in(c)
    page = c.get("/timer?id=kept")
    assert page.status_code == 200 and "<button" not in page.text
    assert c.post("/act", data={"action": "cancel", "id": "kept"}).status_code == 403
    assert timers.get("kept") is not None


def test_without_a_token_the_pages_show_to_anyone(timers: Timers) -> None:
    c = client(timers, token=None)
    for path in [*PAGES, "/live", "/metrics"]:
        assert c.get(path).status_code == 200, path


def test_a_wrong_login_answers_403_on_the_response(timers: Timers) -> None:
    for wrong in ("nope", "s3cret-tokén", "²", ""):
        reply = client(timers).post("/login", data={"token": wrong})
        assert reply.status_code == 403 and 'id="wrong-token"' in reply.text, wrong
        assert COOKIE not in reply.cookies
    right = client(timers).post("/login", data={"token": TOKEN})
    assert right.status_code == 303 and COOKIE in right.cookies


class Clock:
    """The backoff's clock, moved on by the test."""

    def __init__(self) -> None:
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


def test_wrong_tokens_back_their_client_off_exponentially(timers: Timers) -> None:
    clock = Clock()
    guard = Guard(token=TOKEN, backoff=Backoff(clock=clock))
    c, other = client(timers, guard=guard), client(timers, guard=guard, address="10.0.0.2")
    for wait in (1, 2, 4, 8):
        assert c.post("/login", data={"token": "guess"}).status_code == 403
        for offered in ("guess", TOKEN):  # not even the right token is looked at
            reply = c.post("/login", data={"token": offered})
            assert (reply.status_code, reply.headers["retry-after"]) == (429, str(wait))
            assert COOKIE not in reply.cookies and "try again in" in reply.text
        clock.s += wait - 0.5
        assert c.post("/login", data={"token": TOKEN}).status_code == 429
        clock.s += 0.5
    assert other.post("/login", data={"token": "guess"}).status_code == 403  # its own
    assert c.post("/login", data={"token": TOKEN}).status_code == 303  # and forgotten:
    assert c.post("/login", data={"token": "typo"}).status_code == 403
    assert c.post("/login", data={"token": "typo"}).headers["retry-after"] == "1"
    # a scraper's bearer token is a guess like any other
    c = client(timers, guard=Guard(token=TOKEN, backoff=Backoff(clock=clock)))
    wrong = {"Authorization": "Bearer guess"}
    assert c.get("/metrics", headers=wrong).status_code == 401
    reply = c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (reply.status_code, reply.headers["retry-after"]) == (429, "1")
    assert "timers_pending" not in reply.text
    clock.s += 1
    assert c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_backoff_is_capped_and_remembers_a_bounded_number_of_clients() -> None:
    clock = Clock()
    backoff = Backoff(first_s=1, most_s=60, clients=3, clock=clock)
    for _ in range(100):
        backoff.failed("a")
    assert backoff.wait_s("a") == 60
    clock.s += 60 + 60  # quiet for the longest wait after its own: forgotten
    backoff.failed("a")
    assert backoff.wait_s("a") == 1
    for address in ("b", "c", "d"):
        backoff.failed(address)
    assert backoff.wait_s("a") == 0 and backoff.wait_s("d") == 1  # the least recent went
    assert len(backoff._failing) == 3


# -- the Host allowlist ----------------------------------------------------------------


def test_only_localhost_names_and_allowed_hosts_are_answered(timers: Timers) -> None:
    c = client(timers, token=None)
    for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST"):
        assert c.get("/", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example",
                 "[::2]:8080", "bad host"):
        reply = c.get("/", headers={"Host": host})
        assert reply.status_code == 400, host
        assert reply.text == "Invalid host header" and "pending" not in reply.text
    served = client(timers, token=None, hosts=allowed_hosts(
        "0.0.0.0", ["dash.example.com", "*.internal"]))
    for host in ("dash.example.com", "a.b.internal:8080", "localhost:8080"):
        assert served.get("/", headers={"Host": host}).status_code == 200, host
    assert served.get("/", headers={"Host": "evil.example"}).status_code == 400


def test_the_allowlist_holds_the_local_names_the_bind_address_and_the_extra_names() -> None:
    assert allowed_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "[::1]"]
    assert allowed_hosts("0.0.0.0") == ["localhost", "127.0.0.1", "[::1]"]
    assert allowed_hosts("10.0.0.5", ["Dash.Example.com", "::1", "fe80::1"]) == [
        "localhost", "127.0.0.1", "[::1]", "10.0.0.5", "dash.example.com", "[fe80::1]"]
    for bad in ("dash.example.com:8080", "a.*.example.com", "*example.com", "", "http://x"):
        with pytest.raises(ValueError):
            host_name(bad)


# -- the headers -----------------------------------------------------------------------


def test_every_response_carries_the_security_headers_and_scripts_carry_the_nonce(
        timers: Timers) -> None:
    clock = Clock()
    c = client(timers, guard=Guard(token=TOKEN, backoff=Backoff(clock=clock)))
    replies = [c.get("/"), c.get("/login"), c.post("/login", data={"token": "x"}),
               c.post("/login", data={"token": "x"}),  # backed off: 429
               c.get("/", headers={"Host": "evil.example"}), c.get("/no-such-page"),
               c.get("/live")]
    assert replies[3].status_code == 429
    clock.s += 1
    log_in(c)
    replies += [c.get(path) for path in PAGES] + [c.get("/task?name=no.such"),
                                                  c.get("/history?failed=2")]
    replies += [c.get("/timers?page=abc"), c.get("/"), c.post("/act", data={})]
    for reply in replies:
        h = reply.headers
        policy = h["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
        assert "default-src 'none'" in policy
        assert (h["x-frame-options"], h["x-content-type-options"], h["referrer-policy"]) == (
            "DENY", "nosniff", "no-referrer"), reply.request.url
    overview = replies[-2]
    nonce = re.search(r"'nonce-([^']+)'", overview.headers["content-security-policy"])
    assert nonce is not None
    tags = re.findall(r"<(script|style)([^>]*)>", overview.text)
    assert {t for t, _ in tags} == {"script", "style"}
    assert all(f'nonce="{nonce.group(1)}"' in attrs for _, attrs in tags)
    for reply in replies:  # no inline CSS or JS on any page, charts included
        assert re.search(r"<[^>]*\s(style|on\w+)=", reply.text) is None, reply.request.url
    assert "<svg" in overview.text and "<script" not in overview.text.split("<main>")[1] \
        .split("<script nonce=")[0]
    assert nonce.group(1) not in c.get("/").headers["content-security-policy"]  # per reply


# -- notices ---------------------------------------------------------------------------


def test_no_text_from_the_query_string_becomes_the_notice(timers: Timers) -> None:
    c = client(timers)
    log_in(c)
    page = c.get("/timer?id=kept&said=Your+session+expired%2C+call+555-0100")
    assert "555-0100" not in page.text and 'id="said"' not in page.text
    done = c.post("/act", data={"action": "cancel", "id": "kept", "csrf": csrf(c)})
    assert done.status_code == 303 and done.headers["location"] == "/timer?id=kept"
    assert "said" not in done.headers["location"]
    shown = c.get(done.headers["location"])
    assert re.search(r'<p class="said" id="said">cancelled</p>', shown.text)
    assert 'id="said"' not in c.get("/timer?id=kept").text  # once
    c.cookies.set(NOTE_COOKIE, "Q2FsbCA1NTUtMDEwMA==.0000")  # forged: "Call 555-0100"
    assert "555-0100" not in c.get("/").text


def test_no_text_from_the_query_string_is_put_on_any_page(timers: Timers) -> None:
    """A link cannot put words on a page: unknown parameters are ignored, a bad value's
    error says what the value must be without repeating it, a task nothing knows is 404
    without its name."""
    c = client(timers, token=None)
    for path in PAGES:
        sep = "&" if "?" in path else "?"
        page = c.get(f"{path}{sep}said={MARK}&note={MARK}&error={MARK}")
        assert page.status_code == 200 and MARK not in page.text, path
    for path in (f"/task?name={MARK}", f"/task?name=x.{MARK}", f"/history?task=x{MARK}é",
                 f"/timers?group={MARK}é", f"/timers?priority={MARK}",
                 f"/history?failed={MARK}", f"/timers?page={MARK}"):
        reply = c.get(path)
        assert 400 <= reply.status_code < 500 and MARK not in reply.text, path
    for path in ("/task?name=x.Call5550100", "/timer?id=Call5550100"):
        unknown = c.get(path)
        assert unknown.status_code == 404 and "5550100" not in unknown.text, path
    assert c.get("/task?name=x.Call5550100").text.startswith("no such task: ")


# -- malformed input -------------------------------------------------------------------


def test_malformed_or_non_ascii_input_is_a_4xx_that_says_what_it_is(timers: Timers) -> None:
    c = client(timers)
    log_in(c)
    for page in ("²", "abc", "0", "-1", "1.5", "9" * 30, ""):
        reply = c.get("/timers", params={"page": page})
        assert reply.status_code == 400, page
        assert reply.text.startswith("page must be a whole number"), page
    assert c.get("/timers?page=2").status_code == 200
    for path, said in [("/task", "name must be a task path"),
                       ("/task?name=é.sms", "name must be a task path"),
                       ("/task?name=a..b", "name must be a task path"),
                       ("/task?name=" + "a" * 301, "name must be a task path"),
                       ("/history?task=%00", "task must be a task path"),
                       ("/history?failed=yes", "failed must be 1"),
                       ("/timers?group=²", "group must be 1 to 64"),
                       ("/timers?group=" + "g" * 65, "group must be 1 to 64"),
                       ("/timers?priority=1001", "priority must be a whole number"),
                       ("/timers?priority=-0x1", "priority must be a whole number"),
                       ("/timers?priority=\uff15", "priority must be a whole number"),
                       ("/timers?page=101", "page must be a whole number"),
                       ("/timers?task=r%C3%A9", "task must be a task path")]:
        reply = c.get(path)
        assert reply.status_code == 400 and reply.text.startswith(said), path
    for cookie in ("é", "²", "\u00ff" * 64):
        other = TestClient(c.app, base_url=BASE, follow_redirects=False)
        reply = other.get("/", headers={"Cookie": f"{COOKIE}={cookie}; {NOTE_COOKIE}={cookie}"
                                        .encode()})  # type: ignore[arg-type]
        assert reply.status_code == 303, cookie  # not logged in: to the login page
    for bad_csrf in ("é", "²" * 64, ""):
        reply = c.post("/act", data={"action": "cancel", "id": "kept", "csrf": bad_csrf})
        assert reply.status_code == 403 and "CSRF" in reply.text
    broken = c.post("/act", content=b"--x\r\nnot a form",
                    headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert 400 <= broken.status_code < 500
    token = csrf(c)
    empty_id = c.post("/act", data={"action": "cancel", "id": "", "csrf": token})
    assert empty_id.status_code == 400 and empty_id.text.startswith("bad input: ")
    assert c.post("/act", data={"action": "nope", "csrf": token}).status_code == 403
    assert c.get("/timer", params={"id": "é²\u202e"}).status_code == 404
    assert timers.get("kept") is not None


def test_each_error_says_what_it_is(fake: fakeredis.FakeRedis) -> None:
    away = Timers(redis.Redis(port=free_port(), socket_connect_timeout=1))
    away.warn_in_event_loop = False
    reply = client(away, token=None).get("/")
    assert reply.status_code == 503 and reply.text.startswith("Redis cannot be reached: ")
    assert reply.text.endswith(". This page works again once Redis answers.")
    assert "\n" not in reply.text
    fake.set("timers|stats", "not a hash")  # another app wrote a string there
    with Timers(fake) as t:
        t.warn_in_event_loop = False
        reply = client(t, token=None).get("/")
    assert reply.status_code == 502
    assert reply.text.startswith("Redis answered with an error: ")
    assert client(t, token=None).get("/nowhere").text == "Not Found"


def test_the_dashboard_and_metrics_bind_to_localhost_by_default() -> None:
    for command in (web_command, metrics_command):
        assert inspect.signature(command).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(listen_command).parameters["metrics_host"].default == "127.0.0.1"
    assert inspect.signature(web_command).parameters["allow_host"].default is None


def test_a_timer_page_while_redis_is_away_says_so_rather_than_not_pending() -> None:
    away = Timers(redis.Redis(port=free_port(), socket_connect_timeout=1))
    away.warn_in_event_loop = False
    reply = client(away, token=None).get("/timer?id=kept")
    assert reply.status_code == 503 and "Not pending" not in reply.text


def test_every_page_escapes_what_it_shows(fake: fakeredis.FakeRedis, timers: Timers) -> None:
    hostile = "<script>alert(1)</script>"
    with Timers(fake) as t:
        t.warn_in_event_loop = False
        t.schedule("reminders.sms", {"note": hostile}, in_=600, id=hostile, key=hostile)
        t.every(hostile, "reminders.sms", [hostile], interval=60)
        fake.hset("timers|parked", "junk", f"c|1|1000|0|{hostile}")  # another app's junk
        c = client(t, token=None)
        for path in [*PAGES, "/timers?task=reminders.sms", "/timers?q=%3Cscript",
                     "/timer?id=%3Cscript%3Ealert(1)%3C/script%3E"]:
            page = c.get(path)
            assert page.status_code == 200 and "<script>alert" not in page.text, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in c.get("/timers").text
