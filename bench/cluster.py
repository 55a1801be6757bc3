"""Redis Cluster: the same work on a loopback cluster of 1 and of 3 primaries (no replicas),
the timers split into the default shards, one per primary (tests/clusters.py builds the
cluster, each node with the repository's redis.conf, AOF off).

Figures, per cluster size: ``schedule_many`` and single ``schedule()`` rates, fires/s of
N due at once with 2 listener processes, bytes per pending timer (``used_memory`` summed
over the primaries), and lateness of 2,000 timers due over 10 s with 2 listeners beside
the background timers (1,000,000 an hour out in a full run) spread over the shards.

This machine has 2 cores: 3 primaries share them with the listeners and the producer, so
more primaries cannot add throughput here; what they add on separate machines is the
cores and memory of each. The figures show what sharding costs and that it spreads.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench.common import NOOP, PREFIX, Row, args_100, count, due_at, ms, wait_until
from bench.context import Context
from bench.procs import ListenerProc, merge
from tests.clusters import real_cluster
from timers import Timers, TimerSpec
from timers.model.percentiles import percentile

SPREAD_N, SPREAD_S = 2_000, 10.0


def budget(ctx: Context) -> float:
    return 900.0 if not ctx.sizes.quick else 450.0


def background_n(ctx: Context) -> int:
    return 100_000 if ctx.sizes.quick else 1_000_000


def run(ctx: Context) -> None:
    single = redis.Redis.from_url(ctx.url)
    try:  # the figures to compare with: the same work on the bench's own single server
        _all(ctx, "Single server (for comparison)", ctx.url, [single])
    finally:
        single.close()
    for primaries in (1, 3):
        with real_cluster(primaries, replicas=False) as cluster:
            one(ctx, cluster.url, [s.port for s in cluster.primaries])


def one(ctx: Context, url: str, ports: list[int]) -> None:
    name = f"Cluster: {len(ports)} primar{'ies' if len(ports) > 1 else 'y'} " \
           f"({len(ports)} shard{'s' if len(ports) > 1 else ''}, one per primary)"
    print(f"- {name}", flush=True)
    nodes = [redis.Redis(port=p) for p in ports]
    try:
        _all(ctx, name, url, nodes)
    finally:
        for node in nodes:
            node.close()


def _all(ctx: Context, name: str, url: str, nodes: list[redis.Redis]) -> None:
    _schedules(ctx, name, url, nodes)
    _fires(ctx, name, url, nodes)
    _lateness(ctx, name, url, nodes)


def _flush(nodes: list[redis.Redis]) -> None:
    for node in nodes:
        node.flushall()
        node.config_set("appendonly", "no")


def _redis_cpu(nodes: list[redis.Redis]) -> float:
    total = 0.0
    for node in nodes:
        info: dict[str, Any] = node.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def _schedules(ctx: Context, name: str, url: str, nodes: list[redis.Redis]) -> None:
    _flush(nodes)
    n = 20_000 if ctx.sizes.quick else 100_000
    with Timers(url, prefix=PREFIX) as t:
        t.stats()  # the layout, and the connections, before the clock starts
        empty = sum(int(node.info("memory")["used_memory"]) for node in nodes)
        before, cpu = time.perf_counter(), _redis_cpu(nodes)
        for start in range(0, n, 10_000):
            t.schedule_many(TimerSpec(NOOP, args_100(i), in_=86_400)
                            for i in range(start, start + 10_000))
        spent, cpu = time.perf_counter() - before, _redis_cpu(nodes) - cpu
        used = sum(int(node.info("memory")["used_memory"]) for node in nodes)
        single, before = 0, time.perf_counter()
        while time.perf_counter() - before < 2.0:
            t.schedule(NOOP, args_100(single), in_=86_400)
            single += 1
        single_rate = single / (time.perf_counter() - before)
    ctx.results.add(Row(name, "schedule_many /s (100-char args)", (
        f"{count(n / spent)} (Redis CPU {cpu / n * 1e6:.1f} us a timer, all primaries)")))
    ctx.results.add(Row(name, "schedule() /s, one at a time", count(single_rate)))
    ctx.results.add(Row(name, "bytes per pending timer (a day out)",
                        f"{(used - empty) / n:.0f}"))


def _fires(ctx: Context, name: str, url: str, nodes: list[redis.Redis]) -> None:
    _flush(nodes)
    n = 5_000 if ctx.sizes.quick else 20_000
    procs = _listeners(ctx, url, 2)
    try:
        due_ms = round(time.time() * 1000 + 1500 + n / 10)
        with Timers(url, prefix=PREFIX) as t:
            t.schedule_many(TimerSpec(NOOP, [i, due_ms], at=due_at(due_ms)) for i in range(n))
        cpu = _redis_cpu(nodes)
        wait_until(lambda: _fired(url) >= n, n / 500 + 30, 0.2)
        cpu = _redis_cpu(nodes) - cpu
    finally:
        results = [p.result() for p in procs]
    res = merge([r for r in results if r is not None])
    if not res.fired:
        ctx.results.add(Row(name, "fires/s", "nothing fired"))
        return
    span = max(started for _, started, _, _ in res.fired) - due_ms
    ctx.results.add(Row(name, f"fires/s, {count(n)} due at once, 2 listeners", (
        f"{count(len(res.fired) / (span / 1000))} ({count(len(res.fired))} in "
        f"{span / 1000:.2f} s; Redis CPU {cpu / len(res.fired) * 1e6:.1f} us a fire)")))


def _lateness(ctx: Context, name: str, url: str, nodes: list[redis.Redis]) -> None:
    _flush(nodes)
    background = background_n(ctx)
    loaded = time.perf_counter()
    with Timers(url, prefix=PREFIX) as t:
        for start in range(0, background, 20_000):
            t.schedule_many(TimerSpec(NOOP, args_100(i), in_=3600)
                            for i in range(start, min(start + 20_000, background)))
    loaded = time.perf_counter() - loaded
    procs = _listeners(ctx, url, 2)
    try:
        first = time.time() * 1000 + 2000
        with Timers(url, prefix=PREFIX) as t:
            t.schedule_many(TimerSpec(NOOP, [i, round(first + SPREAD_S * 1000 * i / SPREAD_N)],
                                      at=due_at(round(first + SPREAD_S * 1000 * i / SPREAD_N)))
                            for i in range(SPREAD_N))
        wait_until(lambda: _fired(url) >= SPREAD_N, SPREAD_S + 30, 0.2)
    finally:
        results = [p.result() for p in procs]
    res = merge([r for r in results if r is not None])
    late = sorted(res.lateness_ms)
    own = sorted(res.task_lateness)
    if not late:
        ctx.results.add(Row(name, "lateness", "nothing fired"))
        return
    ctx.results.add(Row(name, f"lateness, {count(SPREAD_N)} over {SPREAD_S:g} s beside "
                              f"{count(background)} pending, 2 listeners", (
        f"p50 {ms(percentile(late, 50))} / p99 {ms(percentile(late, 99))} ms"
        + (f" (by the task's clock p99 {ms(percentile(own, 99))})" if own else "")
        + f"; {count(len(late))} fired; background loaded in {loaded:.0f} s")))


def _listeners(ctx: Context, url: str, n: int) -> list[ListenerProc]:
    procs = [ListenerProc(url, ctx.workdir, f"cluster-{i}-{time.monotonic_ns()}",
                          concurrency=ctx.concurrency) for i in range(n)]
    for proc in procs:
        proc.wait_ready(30)
    return procs


def _fired(url: str) -> int:
    with Timers(url, prefix=PREFIX) as t:
        return t.stats().fired

