"""Idle cost: what a listener costs while ``idle_n`` timers are pending a day out.

A day out is beyond the near horizon: nothing is due and no timer comes within the hour
during the window, so the figure is the listener's cost at rest (a backlog coming within
the horizon costs one key write per timer, paced: the lateness rows run during one).

The timers are loaded with AOF off (a bulk load), then a listener child starts; after it
has settled (its start-up sweep) the window opens. The commands it sends are counted with
MONITOR (INFO commandstats would also count the commands its scripts call), leaving out
our own INFO calls; its CPU comes from /proc/<pid>/stat.
"""

from __future__ import annotations

import time

from bench.common import Deadline, Row, count
from bench.context import Context
from bench.server_stats import ServerSample, cpu_seconds

SETTLE_S = 3.0
DAY = 86_400.0
PEER = "Celery 1.6, arq 2.4, Huey 4.4"


def budget(ctx: Context) -> float:
    return ctx.sizes.idle_n / 10_000 + ctx.sizes.idle_s + SETTLE_S + 60


def run(ctx: Context) -> None:
    s = ctx.sizes
    name = f"Idle: {count(s.idle_n)} pending a day out, none due"
    print(f"- {name}", flush=True)
    ctx.fresh_db(aof=False)
    loaded, _ = ctx.bulk_load(s.idle_n, in_=DAY, deadline=Deadline(s.idle_n / 5_000 + 30))
    proc = ctx.listener(max_seconds=s.idle_s + SETTLE_S + 60)
    time.sleep(SETTLE_S)
    ctx.mark()
    monitor = ctx.monitor()
    cpu0 = cpu_seconds(proc.pid)
    before = ServerSample.take(ctx.r)
    time.sleep(s.idle_s)
    after = ServerSample.take(ctx.r)
    cpu1 = cpu_seconds(proc.pid)
    calls = monitor.stop()
    alive = proc.alive()
    proc.stop()
    window = after.at - before.at
    total = sum(calls.values())
    per_s = total / window
    result = f"{per_s:.2f} cmds/s ({total} in {window:.0f} s)"
    if loaded < s.idle_n:
        result += f" - only {count(loaded)} pending (load deadline)"
    if not alive:
        result += " - the listener exited during the window"
    ctx.results.add(Row(name, "listener commands/s", result, "<= 1", per_s <= 1 and alive,
                        PEER))
    cpu_pct = 100 * (cpu1 - cpu0) / window
    redis_pct = 100 * (after.cpu_s - before.cpu_s) / window  # MONITOR costs it a little
    ctx.results.add(Row(name, "listener CPU; redis-server CPU", (
        f"{cpu_pct:.2f}% of a core; redis-server {redis_pct:.1f}%")))
    breakdown = ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "none"
    ctx.results.note(f"{name}: commands in the window: {breakdown}")
