"""Schedule throughput: timers scheduled per second, each with 100-byte args, an hour out.

- single sync ``Timers.schedule()`` calls, one after another, from this process;
- asyncio ``AsyncTimers.schedule`` with ``async_in_flight`` calls in flight;
- one ``schedule_many`` call of ``many_n`` specs (it chunks and pipelines internally); the
  specs are built before the clock starts.

AOF is on (the production redis.conf). Redis CPU per timer comes from INFO (used_cpu).
"""

from __future__ import annotations

import asyncio
import time

from bench.common import HOUR, NOOP, PREFIX, Row, args_100, count
from bench.context import Context
from bench.server_stats import ServerSample
from timers import AsyncTimers, TimerSpec


def budget(ctx: Context) -> float:
    s = ctx.sizes
    return s.sync_s + s.async_s + s.many_n / 10_000 + 60


def _redis_note(ctx: Context, what: str, before: ServerSample, n: int, wall: float) -> None:
    after = ServerSample.take(ctx.r)
    cpu_us = (after.cpu_s - before.cpu_s) / n * 1e6
    calls = after.calls_since(before)
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    script_us = (after.usec_since(before, "evalsha") + after.usec_since(before, "eval")) / n
    nested = sorted(((after.usec_since(before, c) / n, c) for c in calls
                     if c not in ("evalsha", "eval")), reverse=True)
    inside = ", ".join(f"{c.upper()} {us:.1f}" for us, c in nested if us >= 0.1)
    ctx.results.note(
        f"schedule, {what}: {wall / n * 1e6:.1f} us wall per timer; Redis CPU {cpu_us:.1f} us "
        f"per timer ({100 * cpu_us * n / 1e6 / wall:.0f}% of one core), of which script "
        f"execution {script_us:.1f} us (commands inside, us per timer: {inside}); "
        f"{count(scripts)} script calls")


def run(ctx: Context) -> None:
    s = ctx.sizes
    args = args_100(1)

    ctx.fresh_db()
    print("- Schedule: single sync calls", flush=True)
    before = ServerSample.take(ctx.r)
    n = 0
    with ctx.timers() as t:
        t.schedule(NOOP, args, in_=HOUR)  # connect and load scripts outside the clock
        start = time.perf_counter()
        end = start + s.sync_s
        while time.perf_counter() < end:
            for _ in range(50):
                t.schedule(NOOP, args, in_=HOUR)
            n += 50
        wall = time.perf_counter() - start
    rate = n / wall
    ctx.results.add(Row("Schedule: single sync schedule() calls", "schedules/s",
                        f"{count(rate)} ({count(n)} in {wall:.1f} s)", ">= 10,000",
                        rate >= 10_000, "Huey 7,238"))
    _redis_note(ctx, "single sync calls", before, n, wall)
    _round_trip_floor(ctx)

    ctx.fresh_db()
    print(f"- Schedule: asyncio, {s.async_in_flight} in flight", flush=True)
    before = ServerSample.take(ctx.r)
    n, wall = asyncio.run(_async(ctx, s.async_s, s.async_in_flight))
    rate = n / wall
    ctx.results.add(Row(f"Schedule: AsyncTimers.schedule, {s.async_in_flight} in flight",
                        "schedules/s", f"{count(rate)} ({count(n)} in {wall:.1f} s)",
                        ">= 40,000", rate >= 40_000, "BullMQ 35,685 (ioredis pipelining)"))
    _redis_note(ctx, f"asyncio {s.async_in_flight} in flight", before, n, wall)

    ctx.fresh_db()
    print(f"- Schedule: schedule_many of {count(s.many_n)}", flush=True)
    specs = [TimerSpec(NOOP, args_100(i), in_=HOUR) for i in range(s.many_n)]
    with ctx.timers() as t:
        t.schedule(NOOP, args, in_=HOUR)
        before = ServerSample.take(ctx.r)
        start = time.perf_counter()
        t.schedule_many(specs)
        wall = time.perf_counter() - start
    rate = s.many_n / wall
    ctx.results.add(Row(f"Schedule: schedule_many({count(s.many_n)} specs)", "schedules/s",
                        f"{count(rate)} ({wall:.2f} s)", ">= 100,000", rate >= 100_000,
                        "RQ enqueue_many 9,488"))
    _redis_note(ctx, "schedule_many", before, s.many_n, wall)


def _round_trip_floor(ctx: Context, n: int = 5_000) -> None:
    """What one synchronous redis-py call costs here with nothing of ours in it: a PING, and
    an EVALSHA of a script that does nothing. No single-call producer can beat these."""
    with ctx.timers() as t:
        client = t.redis
        trivial = client.register_script("return 1")
        trivial()
        rates = []
        for call in (client.ping, trivial):
            start = time.perf_counter()
            for _ in range(n):
                call()
            rates.append(n / (time.perf_counter() - start))
    ctx.results.note(
        f"schedule, round-trip floor of one sync redis-py call on this machine: PING "
        f"{count(rates[0])}/s ({1e6 / rates[0]:.0f} us), an EVALSHA of `return 1` "
        f"{count(rates[1])}/s ({1e6 / rates[1]:.0f} us)")


async def _async(ctx: Context, seconds: float, in_flight: int) -> tuple[int, float]:
    args = args_100(1)
    done = 0
    async with AsyncTimers(ctx.url, prefix=PREFIX) as t:
        # Open the connections and load the scripts outside the clock.
        await asyncio.gather(*(t.schedule(NOOP, args, in_=HOUR) for _ in range(in_flight)))
        start = time.perf_counter()
        end = start + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await t.schedule(NOOP, args, in_=HOUR)
                done += 1

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return done, time.perf_counter() - start
