"""Watching costs: what a metrics scrape and a dashboard refresh cost Redis with many timers
pending, and what recording Prometheus metrics costs a listener.

- Scrape / refresh: N timers pending (1 M; 100 k with --quick), then each read 20 times:
  the keyspace snapshot (``timers metrics`` per scrape, ``timers top`` per refresh), the
  dashboard's overview and its first page of pending timers. Figures: Redis commands per
  read (``INFO commandstats`` before/after) and milliseconds per read (median).
- Listener with metrics: N timers due at once, one listener process, alternately without
  and with the metrics ``timers listen --metrics-port`` records (3 rounds each): fires/s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import NOOP, Deadline, Row, count, due_at, wait_until
from bench.context import Context
from bench.procs import merge
from timers import TimerSpec
from timers.ops import browse
from timers.ops.snapshot import read_snapshot
from timers.web.pages import Dashboard, overview

READS = 20
ROUNDS = 3


def sizes(ctx: Context) -> tuple[int, int]:
    """(timers pending for the reads, timers fired per metrics round)."""
    return (100_000, 5_000) if ctx.sizes.quick else (1_000_000, 20_000)


def budget(ctx: Context) -> float:
    pending, fired = sizes(ctx)
    return 60 + pending / 20_000 + 2 * ROUNDS * (30 + fired / 2_000)


def run(ctx: Context) -> None:
    pending, fired = sizes(ctx)
    reads(ctx, pending)
    metrics_cost(ctx, fired)


def _commands(ctx: Context) -> int:
    stats = ctx.r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def _measure(ctx: Context, read: Callable[[], Any]) -> tuple[float, float]:
    """(Redis commands per read, median ms per read)."""
    read()  # scripts loaded, connections open
    before = _commands(ctx)
    times = []
    for _ in range(READS):
        started = time.perf_counter()
        read()
        times.append((time.perf_counter() - started) * 1000)
    return (_commands(ctx) - before) / READS, statistics.median(times)


def reads(ctx: Context, n: int) -> None:
    name = f"Watching: {count(n)} timers pending"
    print(f"- {name}", flush=True)
    ctx.fresh_db(aof=False)
    loaded, _ = ctx.bulk_load(n, deadline=Deadline(n / 10_000 + 60))
    with ctx.timers() as t:
        dashboard = Dashboard(t)
        for label, read in (
                ("keyspace snapshot (a metrics scrape, a top refresh)",
                 lambda: t.run(read_snapshot(t.keys))),
                ("dashboard overview refresh", lambda: overview(dashboard)),
                ("dashboard pending page (50 timers)",
                 lambda: t.run(browse.page(t.keys, 0, 50)))):
            commands, millis = _measure(ctx, read)
            ctx.results.add(Row(f"{name}: {label}", "Redis commands; ms per read (median)",
                                f"{commands:.0f} commands; {millis:.2f} ms "
                                f"({count(loaded)} pending)"))


def _fires_per_second(ctx: Context, n: int, metrics: bool) -> float | None:
    ctx.fresh_db()
    proc = ctx.listener(metrics=metrics)
    lead = 1.5 + n / 25_000
    due_ms = round(ctx.redis_now_ms() + lead * 1000)
    with ctx.timers() as t:
        t.schedule_many([TimerSpec(NOOP, [i, due_ms], at=due_at(due_ms)) for i in range(n)])
    wait_until(lambda: ctx.fired_counter() >= n or not proc.alive(), lead + 10 + n / 1000, 0.1)
    result = proc.result()
    if result is None or len(result.fired) < n:
        return None
    last = max(started for _, started, _, _ in merge([result]).fired)
    return n / ((last - due_ms) / 1000)


def metrics_cost(ctx: Context, n: int) -> None:
    name = f"Watching: {count(n)} due at once, 1 listener process, metrics off vs on"
    print(f"- {name}", flush=True)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for metrics in (False, True):
            rate = _fires_per_second(ctx, n, metrics)
            if rate is not None:
                rates[metrics].append(rate)
    if not rates[False] or not rates[True]:
        ctx.results.add(Row(name, "fires/s", "a listener failed"))
        return
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    ctx.results.add(Row(name, "fires/s without / with metrics (median of 3 alternating)",
                        f"{count(off)} / {count(on)} ({(off - on) / off:+.1%} cost); runs: "
                        f"off {', '.join(count(r) for r in rates[False])}, on "
                        f"{', '.join(count(r) for r in rates[True])}",
                        "cost < 5%", (off - on) / off < 0.05))
