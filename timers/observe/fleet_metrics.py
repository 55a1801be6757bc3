"""The keyspace's state as Prometheus metrics (``timers metrics``): one scrape target for the
whole fleet, read from Redis at each scrape (two round trips, see
:mod:`timers.observe.snapshot`), whichever listeners run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from timers.exceptions import TimersError
from timers.observe.snapshot import SOON_MS, FleetSnapshot

log = logging.getLogger("timers.metrics")

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
    due.add_metric(["1m"], snap.due_within(SOON_MS[0]))
    due.add_metric(["1h"], snap.due_within(SOON_MS[1]))
    yield from (pending, overdue, due, running)
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


def serve(read: Callable[[], FleetSnapshot], port: int, host: str) -> CollectorRegistry:
    """Serve the keyspace's metrics on ``host:port`` (a thread); returns the registry."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(read))
    start_http_server(port, addr=host, registry=registry)
    return registry
