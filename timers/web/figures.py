"""The figures behind the dashboard's charts, as pure functions of what was read.

The charts draw the run history's per-minute rows (:class:`timers.model.history.MinuteStats`,
from ``series()``). The overview's runs and failures per minute come from the samples the
dashboard takes of the keyspace's counters and the listeners' heartbeats (:class:`Sample`):
a counter read lower than before was reset (a Redis restarted without its data), so what
it reads now is what it counted since, never a negative rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from timers.model.history import MinuteStats
from timers.model.wire import Counter
from timers.ops.snapshot import FleetSnapshot
from timers.web.charts import Chart, Series

RATE_WINDOW_S = 300.0
"""The span the "runs / min" figure averages over."""


@dataclass(frozen=True)
class Sample:
    """The keyspace's counters and the fleet's lateness at one instant (Redis clock)."""

    at_s: float
    ended_well: int
    """The ``fired`` counter: runs that ended well."""
    dead: int
    """The ``failed`` counter: timers that failed for good."""
    retried: int
    """The ``retried`` counter: failed attempts scheduled again."""
    lateness_p50_ms: float | None = None
    """The worst live listener's p50 over its last minute of runs."""
    lateness_p99_ms: float | None = None

    @classmethod
    def of(cls, snap: FleetSnapshot) -> Sample:
        p50 = [x["lateness_p50_ms"] for x in snap.listeners
               if x.get("lateness_p50_ms") is not None]
        p99 = [x["lateness_p99_ms"] for x in snap.listeners
               if x.get("lateness_p99_ms") is not None]
        c = snap.counters
        return cls(snap.redis_ms / 1000, c.get(Counter.FIRED, 0), c.get(Counter.FAILED, 0),
                   c.get(Counter.RETRIED, 0), max(p50, default=None), max(p99, default=None))


def increase(before: int, after: int) -> int:
    """How much a counter grew from ``before`` to ``after``; a drop is a reset (it started
    again from 0), so the growth is ``after`` itself."""
    return after - before if after >= before else after


def _ended(a: Sample, b: Sample) -> tuple[int, int]:
    """(runs ended, of which failed) between two samples: a run ends well, for good
    (dead) or to be retried."""
    failed = increase(a.dead, b.dead) + increase(a.retried, b.retried)
    return increase(a.ended_well, b.ended_well) + failed, failed


def per_minute(samples: Sequence[Sample], now_s: float,
               window_s: float = RATE_WINDOW_S) -> tuple[float, float] | None:
    """(runs, failures) per minute over the samples of the last ``window_s`` seconds;
    None with fewer than two or no time between them. Samples less than a minute apart
    count as a minute: a burst seen over a few seconds is not stretched to a minute's
    rate."""
    recent = [s for s in samples if s.at_s >= now_s - window_s]
    if len(recent) < 2 or recent[-1].at_s <= recent[0].at_s:
        return None
    runs = failures = 0
    for a, b in itertools.pairwise(recent):
        ended, failed = _ended(a, b)
        runs, failures = runs + ended, failures + failed
    span = max(recent[-1].at_s - recent[0].at_s, 60.0) / 60
    return runs / span, failures / span


def _worst(values: Iterable[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def aligned(rows: Iterable[MinuteStats], start_s: float, count: int,
            step_s: float) -> list[list[MinuteStats]]:
    """The rows in each of ``count`` steps of ``step_s`` seconds from ``start_s``."""
    out: list[list[MinuteStats]] = [[] for _ in range(count)]
    for row in rows:
        at = math.floor((row.minute - start_s) / step_s)
        if 0 <= at < count:
            out[at].append(row)
    return out


def window(now_s: float, minutes: int, step_minutes: int) -> tuple[float, int]:
    """(start, steps) of a chart of the last ``minutes`` minutes up to ``now_s``'s minute
    in steps of ``step_minutes``, the steps on round times."""
    step = step_minutes * 60
    end = (math.floor(now_s / step) + 1) * step
    count = math.ceil(minutes / step_minutes)
    return end - count * step, count


def throughput_chart(chart_id: str, title: str, rows: Sequence[MinuteStats], now_s: float,
                     minutes: int, step_minutes: int = 1, note: str = "") -> Chart:
    """Bars of the runs ended and the failures per step, on one scale."""
    start, count = window(now_s, minutes, step_minutes)
    steps = aligned(rows, start, count, step_minutes * 60)
    unit = "runs / min" if step_minutes == 1 else f"runs / {step_minutes} min"
    runs: list[float | None] = [sum(r.runs for r in s) if s else None for s in steps]
    failures: list[float | None] = [sum(r.failures for r in s) if s else None
                                    for s in steps]
    return Chart(chart_id, title, unit, start, step_minutes * 60,
                 [Series("runs", "runs", runs), Series("failures", "failures", failures)],
                 bars=True, note=note)


def lateness_chart(chart_id: str, title: str, rows: Sequence[MinuteStats], now_s: float,
                   minutes: int = 60, note: str = "") -> Chart:
    """Lines of the lateness p50 and p99 per minute, on one millisecond scale."""
    start, count = window(now_s, minutes, 1)
    steps = aligned(rows, start, count, 60)

    return Chart(chart_id, title, "ms", start, 60, [
        Series("p50", "p50", [_worst(r.lateness_p50_ms for r in s) for s in steps]),
        Series("p99", "p99", [_worst(r.lateness_p99_ms for r in s) for s in steps])],
        note=note)
