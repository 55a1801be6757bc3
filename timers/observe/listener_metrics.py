"""A listener's Prometheus metrics (``timers listen --metrics-port``), with
``prometheus_client``: how its runs ended, by task and group; how late they started and how
long they took; what runs now and how much room is left; how late its event loop answers.

Under ``--processes N`` every child records into a shared directory and the supervisor
serves them all on one port (prometheus_client's multiprocess mode: the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before any child starts).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
)

from timers.listener.endings.ending import Executed
from timers.model.wire import ClaimSource, EndingKind

_multiprocess: Any = multiprocess  # parts of prometheus_client have no types
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENESS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds from due to start: timers start within a millisecond, so buckets go to 0.1 ms."""
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 300.0)
SAMPLE_EVERY = 1.0
"""Seconds between samples of the gauges (running, free slots, loop lag)."""

_OUTCOMES = {EndingKind.OK: "ok", EndingKind.SKIP: "skipped", EndingKind.RETRY: "retried",
             EndingKind.FAIL: "dead"}


def _path(source: str) -> str:
    """event, sweep, handoff, next (next in line on a key slot) or rerun (a run taken over
    from a listener that died)."""
    return "rerun" if source == ClaimSource.RECOVERED.label else source


class ListenerMetrics:
    """The metrics of one listener process, recorded as its runs end."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        kw: dict[str, Any] = {"registry": registry} if registry is not None else {}
        self._ended: list[tuple[str | None, str, EndingKind, str, float, float]] = []
        self._histograms: dict[tuple[Histogram, str], _Buckets] = {}
        self.runs = Counter("timers_runs_total", "Runs ended, by task, group and outcome "
                            "(ok, retried, dead, skipped)", ["task", "group", "outcome"], **kw)
        self.started = Counter("timers_started_total", "Runs started, by the path that found "
                               "them (event, sweep, handoff, next, rerun)", ["path"], **kw)
        self.reruns = Counter("timers_reruns_total", "Runs of timers whose listener died "
                              "mid-run, run again here", ["task", "group"], **kw)
        self.rejected = Counter("timers_rejected_total",
                                "Expired keys that named no runnable timer", **kw)
        self.handed_back = Counter("timers_handed_back_total",
                                   "Unfinished runs handed back at shutdown", **kw)
        self.lateness = Histogram("timers_lateness_seconds", "Due time to start, seconds",
                                  ["group"], buckets=LATENESS_BUCKETS, **kw)
        self.duration = Histogram("timers_run_duration_seconds", "Start to end of a run",
                                  ["task"], buckets=DURATION_BUCKETS, **kw)
        self.running = Gauge("timers_running", "Runs under way",
                             multiprocess_mode="livesum", **kw)
        self.free_slots = Gauge("timers_free_slots", "Runs this listener could start now",
                                multiprocess_mode="livesum", **kw)
        self.loop_lag = Gauge("timers_loop_lag_seconds", "How late the listener's event loop "
                              "answers (a blocked loop delays every timer)",
                              multiprocess_mode="livemax", **kw)

    def ended(self, done: Executed) -> None:
        """A run ended (see :class:`timers.listener.health.tally.RunTally`): noted here, handed to
        prometheus_client once a second by :meth:`flush`, far cheaper per run than its
        own calls would be (figures: bench/FINDINGS.md, "A run's Python in the listener")."""
        report = done.report
        if done.ending is not None and report is not None:
            self._ended.append((report.task, report.group, done.ending.kind, report.source,
                                report.started_ms - report.due_ms,
                                report.finished_ms - report.started_ms))

    def flush(self) -> None:
        """Hand what was noted since the last flush to prometheus_client (counted with
        ``Counter`` and ``bisect`` over whole lists: C loops, not a Python loop a run)."""
        ended, self._ended = self._ended, []
        if not ended:
            return
        counts: collections.Counter[tuple[Any, tuple[str, ...]]] = collections.Counter()
        for (task, group, kind, source), n in collections.Counter(
                e[:4] for e in ended).items():
            outcome, path = _OUTCOMES.get(kind), _path(source)
            if outcome is None:
                continue
            counts[(self.runs, (task or "(unknown)", group, outcome))] += n
            counts[(self.started, (path,))] += n
            if path == "rerun":
                counts[(self.reruns, (task or "(unknown)", group))] += n
        for (metric, labels), n in counts.items():
            metric.labels(*labels).inc(n)
        late: dict[str, list[float]] = collections.defaultdict(list)
        took: dict[str, list[float]] = collections.defaultdict(list)
        for task, group, kind, _, lateness_ms, duration_ms in ended:
            if kind in _OUTCOMES:
                late[group].append(lateness_ms)
                took[task or "(unknown)"].append(duration_ms)
        for group, values in late.items():
            self._buckets(self.lateness, group).add_ms(values)
        for task, values in took.items():
            self._buckets(self.duration, task).add_ms(values)
        for (histogram, label), buckets in self._histograms.items():
            buckets.flush_into(histogram.labels(label))

    def _buckets(self, histogram: Histogram, label: str) -> _Buckets:
        found = self._histograms.get((histogram, label))
        if found is None:
            bounds = LATENESS_BUCKETS if histogram is self.lateness else DURATION_BUCKETS
            found = self._histograms[(histogram, label)] = _Buckets(bounds)
        return found

    def handed_back_runs(self, n: int) -> None:
        self.handed_back.inc(n)

    def rejected_key(self) -> None:
        self.rejected.inc()

    async def sample(self, running: Callable[[], int], free: Callable[[], int],
                     stopping: asyncio.Event) -> None:
        """Set the gauges every :data:`SAMPLE_EVERY` seconds until ``stopping``."""
        loop = asyncio.get_running_loop()
        while not stopping.is_set():
            self.flush()
            self.running.set(running())
            self.free_slots.set(free())
            asked = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), SAMPLE_EVERY)
            self.loop_lag.set(max(loop.time() - asked - SAMPLE_EVERY, 0.0))
        self.flush()


class _Buckets:
    """A histogram's observations since the last flush: a count per bucket and the sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds_ms = [b * 1000 for b in bounds]
        self.counts = [0] * (len(bounds) + 1)  # the last: +Inf
        self.total = 0.0

    def add_ms(self, values: list[float]) -> None:
        """Observe ``values`` (milliseconds; a negative one counts as 0)."""
        place = functools.partial(bisect.bisect_left, self.bounds_ms)
        for index, n in collections.Counter(map(place, values)).items():
            self.counts[index] += n
        self.total += sum(filter(lambda v: v > 0, values)) / 1000

    def flush_into(self, child: Any) -> None:
        """Add the counts to a prometheus_client histogram child (its bucket values in
        order, +Inf last, and its sum in seconds), then start again."""
        if not any(self.counts):
            return
        for value, n in zip(child._buckets, self.counts, strict=True):
            if n:
                value.inc(n)
        child._sum.inc(self.total)
        self.counts = [0] * len(self.counts)
        self.total = 0.0


def serve(port: int, host: str) -> None:
    """Serve this process's metrics (the default registry) on ``host:port``."""
    start_http_server(port, addr=host)


def serve_children(port: int, host: str) -> None:
    """The supervisor's side of ``--processes N``: serve every child's metrics, read from
    the directory :func:`share_with_children` set up."""
    registry = CollectorRegistry()
    _multiprocess.MultiProcessCollector(registry)
    start_http_server(port, addr=host, registry=registry)


def share_with_children(directory: str) -> None:
    """Make the children record into ``directory`` (before any of them starts)."""
    os.environ[MULTIPROC_ENV] = directory


def child_died(pid: int) -> None:
    """Drop a dead child's live gauges from what the supervisor serves."""
    if os.environ.get(MULTIPROC_ENV):
        _multiprocess.mark_process_dead(pid)
