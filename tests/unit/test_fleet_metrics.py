"""What a keyspace scrape reads with: short timeouts put into any URL, a reader that can be
made while Redis is away, and a scrape that then reports only that Redis is unreadable."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from timers.dev.server import free_port
from timers.exceptions import TimersError
from timers.observe.fleet_metrics import (
    SCRAPE_TIMEOUT,
    FleetCollector,
    KeyspaceReader,
    with_timeouts,
)
from timers.ops.snapshot import FleetSnapshot, QueueFigures


def test_the_scrape_timeouts_replace_the_urls_own() -> None:
    url = with_timeouts("redis://u:p@h:6379/2?socket_timeout=30&max_connections=5", 1.0)
    parts = urlsplit(url)
    assert (parts.netloc, parts.path) == ("u:p@h:6379", "/2")
    assert parse_qs(parts.query) == {"socket_timeout": ["1.0"], "max_connections": ["5"],
                                     "socket_connect_timeout": ["1.0"]}


def test_the_scrape_timeouts_keep_the_urls_other_settings_even_blank_ones() -> None:
    url = with_timeouts("redis://h/0?client_name=&protocol=3", 2.0)
    assert parse_qs(urlsplit(url).query, keep_blank_values=True) == {
        "client_name": [""], "protocol": ["3"], "socket_timeout": ["2.0"],
        "socket_connect_timeout": ["2.0"]}


def test_a_reader_is_made_while_redis_is_away_and_a_scrape_says_only_that() -> None:
    reader = KeyspaceReader(f"redis://127.0.0.1:{free_port()}/0")
    assert reader.keyspace_prefix == "timers"
    started = time.monotonic()
    with pytest.raises(TimersError):
        reader()
    assert time.monotonic() - started < 2 * SCRAPE_TIMEOUT
    registry = CollectorRegistry()
    registry.register(FleetCollector(reader))
    text = generate_latest(registry).decode()
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "timers_keyspace_readable 0.0"]
    reader.close()


def test_a_bad_url_is_refused_when_the_reader_is_made() -> None:
    with pytest.raises(ValueError):
        KeyspaceReader("redis://127.0.0.1:6379/0?max_connections=0")


def test_a_group_with_timers_and_no_listener_serving_it_scrapes_as_zero() -> None:
    snap = FleetSnapshot(
        redis_ms=0, queues=[QueueFigures("default", 0, 3, 0, 0, 0),
                            QueueFigures("video", 0, 2, 2, 0, 0)],
        running={}, held_back=0, dead=0, failures=0, counters={},
        listeners=[{"groups": []}, {"groups": ["default", "billing"]}],
        recurrences=0, recurrences_paused=0, groups=["default", "video"])
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: snap))
    value = registry.get_sample_value
    assert value("timers_listeners_serving", {"group": "default"}) == 2
    assert value("timers_listeners_serving", {"group": "billing"}) == 1
    assert value("timers_listeners_serving", {"group": "video"}) == 0
