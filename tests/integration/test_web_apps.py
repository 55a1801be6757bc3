"""Producers inside real web apps, with the default settings.

An ASGI app (FastAPI under uvicorn, its :class:`AsyncTimers` made and closed in the
lifespan) and a WSGI app (Flask under werkzeug's threaded server, the module-level
``timers.schedule``) each take 500 concurrent requests that schedule a timer: every request
returns 200 and a real listener fires every timer exactly once — also when Redis pauses for
a second half-way through the burst (the requests wait; none fails for want of a
connection).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import logging
import multiprocessing
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import httpx2
import pytest
import redis
import uvicorn
from fastapi import FastAPI, Request
from flask import Flask
from werkzeug.serving import make_server

import timers
from tests.conftest import wait_until
from tests.integration.helpers import ListenerThread, run_counts, settled
from timers import AsyncTimers, Timers
from timers.store.connect import URL_ENV

pytestmark = [pytest.mark.integration, pytest.mark.one_server, pytest.mark.timeout(180)]

N = 500
IN = 1.5
"""Each request schedules ``record.hit("user-<n>")`` due this many seconds later."""
PAUSE_MS = 1000


def asgi_app(redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncTimers(redis_url) as t:  # default pool: 50 connections
            app.state.timers = t
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/signup/{n}")
    async def signup(n: int, request: Request) -> dict[str, str]:
        t: AsyncTimers = request.app.state.timers
        return {"timer": await t.schedule("record.hit", [f"user-{n}"], in_=IN)}

    return app


def wsgi_app() -> Flask:
    app = Flask(__name__)

    @app.post("/signup/<int:n>")
    def signup(n: int) -> dict[str, str]:
        return {"timer": timers.schedule("record.hit", [f"user-{n}"], in_=IN)}

    return app


@contextmanager
def uvicorn_serving(app: FastAPI) -> Iterator[int]:
    """``app`` under uvicorn in a thread (lifespan on); yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 20,
                   message="uvicorn to start")
        assert server.started, "uvicorn did not start"
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    assert not thread.is_alive(), "uvicorn did not stop"


@contextmanager
def werkzeug_serving(app: Flask) -> Iterator[int]:
    """``app`` under werkzeug's threaded server (a thread per request); yields the port."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = make_server("127.0.0.1", 0, app, threaded=True)
    server.socket.listen(2048)  # gunicorn's backlog: 500 connects at once are all queued
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(30)
        server.server_close()


@dataclass
class Burst:
    """What the test saw of its requests (monotonic times)."""

    statuses: list[int] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)
    pause_ends: float | None = None

    def line(self, label: str) -> str:
        slowest = max(e - s for s, e in self.spans)
        return (f"\n{label}: {self.statuses.count(200)}/{len(self.statuses)} returned 200, "
                f"slowest {slowest:.2f} s, {self.waited_out_the_pause()} waited out the pause")

    def waited_out_the_pause(self) -> int:
        """Requests under way when the pause ended (they had to wait for it)."""
        end = self.pause_ends
        return 0 if end is None else sum(1 for s, e in self.spans if s < end < e)


@pytest.fixture
def pauser(redis_url: str) -> Iterator[Callable[[], float]]:
    """``pause()``: ``CLIENT PAUSE 1000 ALL`` from its own connection once ~a fifth of the
    timers are written; returns when the pause ends (monotonic). Unpaused after the test."""
    client = redis.Redis.from_url(redis_url)

    def pause() -> float:
        wait_until(lambda: client.zcard("timers|due") >= N // 5, 60,
                   message="a fifth of the requests to schedule")
        client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        return time.monotonic() + PAUSE_MS / 1000

    yield pause
    client.execute_command("CLIENT", "UNPAUSE")
    client.close()


def assert_every_timer_fired_once(r: redis.Redis, redis_url: str) -> None:
    expected = {f"user-{n}" for n in range(N)}
    wait_until(lambda: set(run_counts(r)) >= expected, 90, interval=0.1,
               message=f"all {N} timers to fire")
    with Timers(redis_url) as t:
        wait_until(lambda: settled(t), 30, message="nothing pending or running")
    counts = run_counts(r)
    assert set(counts) == expected
    assert {tag: n for tag, n in counts.items() if n != 1} == {}, "each fired exactly once"


# -- the ASGI app ----------------------------------------------------------------------


async def _asgi_burst(port: int, pause: Callable[[], float] | None) -> Burst:
    burst = Burst()
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=0)  # 500 users
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                 limits=limits) as client:
        async def signup(n: int) -> None:
            start = time.monotonic()
            response = await client.post(f"/signup/{n}")
            burst.spans.append((start, time.monotonic()))
            burst.statuses.append(response.status_code)

        first = [asyncio.create_task(signup(n)) for n in range(N // 2)]
        if pause is not None:
            burst.pause_ends = await asyncio.to_thread(pause)
        rest = [asyncio.create_task(signup(n)) for n in range(N // 2, N)]
        await asyncio.gather(*first, *rest)
    return burst


@pytest.mark.parametrize("with_pause", [False, True], ids=["steady", "redis-paused-1s"])
def test_an_asgi_app_schedules_500_concurrent_requests_and_each_timer_fires_once(
        redis_url: str, r: redis.Redis, start_listener: Callable[..., ListenerThread],
        pauser: Callable[[], float], with_pause: bool) -> None:
    start_listener()
    with uvicorn_serving(asgi_app(redis_url)) as port:
        burst = asyncio.run(_asgi_burst(port, pauser if with_pause else None))
    print(burst.line(f"ASGI (FastAPI, uvicorn) {'with' if with_pause else 'no'} pause"))
    assert burst.statuses == [200] * N
    if with_pause:
        assert burst.waited_out_the_pause() > 0, "the pause came while requests were under way"
    assert_every_timer_fired_once(r, redis_url)


# -- the WSGI app ----------------------------------------------------------------------


@pytest.fixture
def default_timers(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The module-level default as an app gets it: made on first use from the env."""
    monkeypatch.setenv(URL_ENV, redis_url)
    monkeypatch.setattr(timers, "_default", None)
    yield
    if timers._default is not None:
        timers._default.close()


def _wsgi_burst(port: int, pause: Callable[[], float] | None) -> Burst:
    burst = Burst()

    def signup(n: int) -> None:
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", f"/signup/{n}")
            status = conn.getresponse().status
        finally:
            conn.close()
        burst.spans.append((start, time.monotonic()))
        burst.statuses.append(status)

    with concurrent.futures.ThreadPoolExecutor(max_workers=N) as pool:
        first = [pool.submit(signup, n) for n in range(N // 2)]
        if pause is not None:
            burst.pause_ends = pause()
        rest = [pool.submit(signup, n) for n in range(N // 2, N)]
        for future in [*first, *rest]:
            future.result(timeout=120)
    return burst


@pytest.mark.parametrize("with_pause", [False, True], ids=["steady", "redis-paused-1s"])
def test_a_wsgi_app_schedules_500_concurrent_requests_and_each_timer_fires_once(
        redis_url: str, r: redis.Redis, start_listener: Callable[..., ListenerThread],
        pauser: Callable[[], float], default_timers: None, with_pause: bool) -> None:
    start_listener()
    with werkzeug_serving(wsgi_app()) as port:
        burst = _wsgi_burst(port, pauser if with_pause else None)
    print(burst.line(f"WSGI (Flask, werkzeug) {'with' if with_pause else 'no'} pause"))
    assert burst.statuses == [200] * N
    if with_pause:
        assert burst.waited_out_the_pause() > 0, "the pause came while requests were under way"
    assert_every_timer_fired_once(r, redis_url)


# -- the asyncio default under two test clients --------------------------------------


def test_an_app_on_the_aio_default_works_under_two_test_clients_in_turn(
        redis_url: str, r: redis.Redis) -> None:
    """Each ``TestClient`` runs the app on an event loop of its own: ``timers.aio`` gives
    each its own client (before, the second failed with 'attached to a different loop')."""
    from fastapi.testclient import TestClient

    app = FastAPI()

    @app.post("/signup/{n}")
    async def signup(n: int) -> dict[str, str]:
        return {"timer": await timers.aio.schedule("record.hit", [n], in_=3600, id=f"u{n}")}

    timers.aio.configure(redis_url)
    try:
        for n in (1, 2):
            with TestClient(app) as client:
                assert client.post(f"/signup/{n}").json() == {"timer": f"u{n}"}
    finally:
        timers.aio.configure()
    assert sorted(r.zrange("timers|due", 0, -1)) == ["u1", "u2"]


# -- a client made before the fork (gunicorn --preload) ----------------------------------


def _worker(t: Timers, n: int, ids: multiprocessing.Queue[int]) -> None:
    t.schedule("record.hit", [f"worker-{n}"], in_=3600, id=f"worker-{n}")
    ids.put(t.redis.client_id())


def test_a_client_made_before_the_fork_works_in_each_worker_on_its_own_connections(
        redis_url: str, r: redis.Redis) -> None:
    with Timers(redis_url) as t:
        t.schedule("record.hit", ["master"], in_=3600, id="master")  # the master connects
        master_id = t.redis.client_id()
        fork = multiprocessing.get_context("fork")
        ids: multiprocessing.Queue[int] = fork.Queue()
        workers = [fork.Process(target=_worker, args=(t, n, ids)) for n in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        assert [w.exitcode for w in workers] == [0, 0, 0]
        worker_ids = {ids.get(timeout=5) for _ in workers}
        assert master_id not in worker_ids and len(worker_ids) == 3, "no socket shared"
        assert t.redis.client_id() == master_id, "the master's connection is intact"
    assert sorted(r.zrange("timers|due", 0, -1)) == ["master", "worker-0", "worker-1",
                                                     "worker-2"]
