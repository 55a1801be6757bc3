"""The keyspace's state as Prometheus metrics (``timers metrics``): one scrape target for the
whole fleet, read from Redis at each scrape (two round trips, see
:mod:`timers.ops.snapshot`), whichever listeners run.

A scrape reads through a :class:`KeyspaceReader`, whose connections give up after
:data:`SCRAPE_TIMEOUT` seconds: while Redis is paused or away a scrape answers in about
that long with ``timers_keyspace_readable 0`` and no other figure (none would be current),
well within Prometheus' default scrape timeout of 10 s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from timers.exceptions import TimersError
from timers.ops.snapshot import SOON_MS, FleetSnapshot
from timers.producer.client import Timers
from timers.store.connect import configured_url

log = logging.getLogger("timers.metrics")

SCRAPE_TIMEOUT = 1.0
"""Seconds a scrape waits to connect to Redis, and for each reply, before it reports Redis
unreadable."""

COUNTERS = {"fired": "Runs that ended well", "failed": "Timers that failed for good (dead)",
            "retried": "Failed attempts scheduled again", "reruns": "Runs claimed again "
            "after their listener died", "rejected": "Expired keys that named no timer",
            "skipped": "Recurring runs skipped on purpose", "handed_back": "Unfinished runs "
            "handed back at shutdown", "waited": "Times a timer waited for a concurrency key",
            "rate_limited": "Times a timer waited for a rate limit"}


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def families(snap: FleetSnapshot, read_seconds: float) -> Iterator[GaugeMetricFamily |
                                                                   CounterMetricFamily]:
    """The metric families of one snapshot."""
    pending = GaugeMetricFamily("timers_pending", "Timers pending (waiting ones included), "
                                "per group", labels=["group"])
    overdue = GaugeMetricFamily("timers_overdue", "Timers due over a second ago and not "
                                "claimed: no listener keeps up (or none serves the group)",
                                labels=["group"])
    due = GaugeMetricFamily("timers_due_within", "Timers due from now to the window's end",
                            labels=["window"])
    running = GaugeMetricFamily("timers_running_runs", "Runs under way, per group",
                                labels=["group"])
    for group, count in snap.pending_by_group().items():
        pending.add_metric([group], count)
        overdue.add_metric([group], sum(q.overdue for q in snap.queues if q.group == group))
    for group, count in snap.running.items():
        running.add_metric([group], count)
    serving = GaugeMetricFamily("timers_listeners_serving", "Live listeners serving the "
                                "group (0: its timers wait for one)", labels=["group"])
    for group, count in snap.serving().items():
        serving.add_metric([group], count)
    due.add_metric(["1m"], snap.due_within(SOON_MS[0]))
    due.add_metric(["1h"], snap.due_within(SOON_MS[1]))
    yield from (pending, overdue, due, running, serving)
    yield _gauge("timers_held_back", "Timers held back by a concurrency key or rate limit",
                 snap.held_back)
    yield _gauge("timers_dead", "Dead timers kept for retry or purge", snap.dead)
    yield _gauge("timers_listeners", "Live listeners (heartbeat within its deadline)",
                 len(snap.listeners))
    yield _gauge("timers_recurrences", "Recurring timers", snap.recurrences)
    yield _gauge("timers_recurrences_paused", "Recurring timers paused",
                 snap.recurrences_paused)
    yield _gauge("timers_snapshot_read_seconds", "How long reading this scrape's figures "
                 "from Redis took", read_seconds)
    for name, doc in COUNTERS.items():
        yield CounterMetricFamily(f"timers_keyspace_{name}", f"{doc}, since the keyspace "
                                  "began (every listener)", value=snap.counters.get(name, 0))


class FleetCollector(Collector):
    """Reads a snapshot at each scrape (``read`` does the round trips)."""

    def __init__(self, read: Callable[[], FleetSnapshot]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        started = time.perf_counter()
        try:
            snap = self.read()
        except TimersError as exc:  # Redis away: say so in the scrape, not with a 500
            log.warning("cannot read the keyspace for metrics: %s", exc)
            yield _gauge("timers_keyspace_readable", "1 when this scrape could read Redis", 0)
            return
        yield _gauge("timers_keyspace_readable", "1 when this scrape could read Redis", 1)
        yield from families(snap, time.perf_counter() - started)


def with_timeouts(url: str, seconds: float) -> str:
    """``url`` with ``?socket_timeout=`` and ``?socket_connect_timeout=`` set to
    ``seconds`` (replacing the URL's own)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in ("socket_timeout", "socket_connect_timeout")]
    query += [("socket_timeout", str(seconds)), ("socket_connect_timeout", str(seconds))]
    return urlunsplit(parts._replace(query=urlencode(query)))


class KeyspaceReader:
    """Reads a keyspace's snapshot for scrapes, every connection with ``timeout`` (s).

    The client is made at the first read that can make it (a Redis Cluster client needs
    the cluster to answer as it is made), so a scrape target can start, and answer, while
    Redis is down. A bad URL is refused when the reader is made (ValueError)."""

    def __init__(self, url: str | None, prefix: str | None = None,
                 timeout: float = SCRAPE_TIMEOUT) -> None:
        self.url = with_timeouts(configured_url(url), timeout)
        self.prefix, self.timeout = prefix, timeout
        self._timers: Timers | None = None
        self._lock = threading.Lock()
        try:
            self._client()
        except TimersError as exc:  # (a cluster that does not answer yet)
            log.warning("cannot read the keyspace yet: %s", exc)

    def _client(self) -> Timers:
        with self._lock:
            if self._timers is None:
                made = Timers(self.url, prefix=self.prefix)
                if isinstance(made.redis, redis.Redis):  # (a Sentinel primary's too)
                    made.redis.connection_pool.connection_kwargs.update(
                        socket_timeout=self.timeout, socket_connect_timeout=self.timeout)
                self._timers = made
            return self._timers

    @property
    def keyspace_prefix(self) -> str | None:
        """The prefix read (None until the client is made)."""
        return None if self._timers is None else self._timers.keys.prefix

    def __call__(self) -> FleetSnapshot:
        """The snapshot now; :class:`TimersError` if Redis does not answer in time."""
        timers = self._client()
        return timers.run(timers.ops.snapshot())

    def close(self) -> None:
        """Close the client's connections."""
        if self._timers is not None:
            self._timers.close()


def serve(read: Callable[[], FleetSnapshot], port: int, host: str) -> CollectorRegistry:
    """Serve the keyspace's metrics on ``host:port`` (a thread); returns the registry."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(read))
    start_http_server(port, addr=host, registry=registry)
    return registry
