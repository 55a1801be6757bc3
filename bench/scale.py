"""Scale: ``scale_n`` timers (10,000,000 in a full run) pending a day out, 100-byte args.

Loaded with ``schedule_many`` (AOF off, as a bulk load), then, in turn:

- **memory**: INFO ``used_memory`` delta over N, and the server's resident size;
- **idle**: a listener started on the loaded server settles, then for ``idle_s`` seconds
  its CPU and resident size and the server's CPU are read, with nothing due;
- **lateness**: AOF is turned back on and its rewrite of the whole dataset awaited (as in
  the other lateness rows), then ``spread_n`` timers due over ``spread_s`` seconds are
  scheduled next to the N and fired by a fresh listener: lateness p50/p99/max, and the
  share the ``expired`` event delivered first.

What limits the figure on this machine is said in the notes: the load is as fast as
``schedule_many`` (one Redis core), and the rewrite forks a copy of a multi-GB dataset.
"""

from __future__ import annotations

import time

from bench import lateness
from bench.common import Deadline, Row, count
from bench.context import Context
from bench.server_stats import ServerSample, cpu_seconds

DAY = 86_400.0
MEMORY_TARGET = 3.5 * 2**30
SETTLE_S = 3.0
TASK = "reminders.sms"


def size(ctx: Context) -> int:
    return ctx.sizes.scale_n


def budget(ctx: Context) -> float:
    n = size(ctx)
    return n / 20_000 + n / 50_000 + ctx.sizes.idle_s + ctx.sizes.spread_s + 240


def run(ctx: Context) -> None:
    n = size(ctx)
    label = f"Scale: {count(n)} pending a day out, 100 B args"
    print(f"- {label}: loading", flush=True)
    ctx.fresh_db(aof=False)
    before = ctx.used_memory()
    loaded, seconds = ctx.bulk_load(n, task=TASK, in_=DAY, deadline=Deadline(n / 10_000 + 60))
    used = ctx.used_memory() - before
    rss = int(ctx.r.info("memory")["used_memory_rss"])
    result = (f"{used / 2**30:.2f} GiB used_memory ({used / loaded:,.0f} B/timer), "
              f"RSS {rss / 2**30:.2f} GiB; loaded in {seconds:.0f} s "
              f"({count(loaded / seconds)}/s)")
    if loaded < n:
        result += f" - only {count(loaded)} of {count(n)} by the load deadline"
    ctx.results.add(Row(label, "Redis memory; load time (schedule_many, AOF off)", result,
                        "<= 3.5 GB", loaded == n and used <= MEMORY_TARGET,
                        "BullMQ 898 B/timer"))
    _idle(ctx, label)
    started = time.monotonic()
    ctx.set_aof(True)
    ctx.wait_aof_settled(seconds=600)
    ctx.results.note(f"{label}: AOF turned on, its rewrite took "
                     f"{time.monotonic() - started:.0f} s before the lateness run")
    lateness.spread(ctx, loaded, f"{count(loaded)} pending a day out",
                    target_p99=5.0)


def _idle(ctx: Context, label: str) -> None:
    s = ctx.sizes
    proc = ctx.listener(max_seconds=s.idle_s + SETTLE_S + 120)
    time.sleep(SETTLE_S)
    ctx.mark()
    cpu0, before = cpu_seconds(proc.pid), ServerSample.take(ctx.r)
    time.sleep(s.idle_s)
    cpu1, after = cpu_seconds(proc.pid), ServerSample.take(ctx.r)
    listener_rss = _rss_bytes(proc.pid)
    alive = proc.alive()
    proc.stop()
    window = after.at - before.at
    result = (f"listener {100 * (cpu1 - cpu0) / window:.2f}% of a core, "
              f"RSS {listener_rss / 2**20:.0f} MiB; redis-server "
              f"{100 * (after.cpu_s - before.cpu_s) / window:.1f}% of a core")
    if not alive:
        result += " - the listener exited during the window"
    ctx.results.add(Row(label, f"idle {s.idle_s:g} s: CPU and memory", result))


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
