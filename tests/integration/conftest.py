"""Fixtures for the integration tests (helpers live in :mod:`tests.integration.helpers`).

Every test here talks to the real server of the session (``redis_url`` in
``tests/conftest.py``, flushed per test). The test tasks in ``tests/task_pkg`` report their
runs to ``$TIMERS_TEST_URL``, which an autouse fixture points at that server.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import ROOT
from tests.integration.helpers import ListenerThread, Processes
from tests.task_pkg import URL_ENV
from timers import Timers
from timers.dev.server import EmbeddedServer


@pytest.fixture(autouse=True)
def test_url(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the test tasks at the session server."""
    monkeypatch.setenv(URL_ENV, redis_url)
    return redis_url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client of the test server that returns str."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def paused(redis_url: str) -> Iterator[redis.Redis]:
    """A second client that can pause the server; unpaused afterwards whatever happens."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.execute_command("CLIENT", "UNPAUSE")
    client.close()


@pytest.fixture
def timers_client(redis_url: str) -> Iterator[Timers]:
    with Timers(redis_url) as t:
        yield t


@pytest.fixture
def start_listener(redis_url: str) -> Iterator[Callable[..., ListenerThread]]:
    """``start_listener(**Listener options)``: a listener thread, stopped after the test."""
    started: list[ListenerThread] = []

    def start(url: str | None = None, wait_subscribed: bool = True,
              **options: Any) -> ListenerThread:
        thread = ListenerThread(url or redis_url, name=f"listener-{len(started)}", **options)
        started.append(thread)
        return thread.start(wait_subscribed)

    yield start
    errors = []
    for thread in started:
        try:
            thread.stop()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def processes(tmp_path: Path, redis_url: str) -> Iterator[Processes]:
    procs = Processes(tmp_path, redis_url)
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own (repository redis.conf, AOF on), which the test may
    pause, stop and start again; resumed and stopped after it."""
    server = EmbeddedServer(config=ROOT / "redis.conf").start()
    try:
        yield server
    finally:
        if server.pid is not None:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()
