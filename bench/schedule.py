"""Schedule throughput: timers scheduled per second, each with 100-byte args, an hour out.

- single sync ``Timers.schedule()`` calls, one after another, from this process, in turns
  with Huey's ``task.schedule(delay=3600)`` on the same server when huey is installed (the
  dev extra installs it), so both meet the same spells of a shared machine;
- asyncio ``AsyncTimers.schedule`` with ``async_in_flight`` calls in flight;
- one ``schedule_many`` call of ``many_n`` specs (it chunks and pipelines internally); the
  specs are built before the clock starts.

AOF is on (the production redis.conf). Redis CPU per timer comes from INFO (used_cpu).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import HOUR, NOOP, PREFIX, Row, args_100, count
from bench.context import Context
from bench.server_stats import ServerSample
from timers import AsyncTimers, TimerSpec


def budget(ctx: Context) -> float:
    s = ctx.sizes
    return s.sync_s + s.async_s + s.many_n / 10_000 + 60


@dataclass
class _Spent:
    """What Redis spent on one contender: CPU seconds, calls and usec per command."""

    cpu_s: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)
    usec: Counter[str] = field(default_factory=Counter)

    def add(self, before: ServerSample, after: ServerSample) -> _Spent:
        self.cpu_s += after.cpu_s - before.cpu_s
        self.calls.update(after.calls_since(before))
        for name in after.usec:
            self.usec[name] += after.usec_since(before, name)
        return self


def _redis_note(ctx: Context, what: str, spent: _Spent, n: int, wall: float) -> float:
    """Note what Redis spent per timer; returns the script execution time per timer."""
    cpu_us = spent.cpu_s / n * 1e6
    script_commands = ("fcall", "evalsha", "eval")
    scripts = sum(spent.calls[c] for c in script_commands)
    script_us = sum(spent.usec[c] for c in script_commands) / n
    nested = sorted(((spent.usec[c] / n, c) for c in spent.calls
                     if c not in script_commands), reverse=True)
    inside = ", ".join(f"{c.upper()} {us:.1f}" for us, c in nested if us >= 0.1)
    ctx.results.note(
        f"schedule, {what}: {wall / n * 1e6:.1f} us wall per timer; Redis CPU {cpu_us:.1f} us "
        f"per timer ({100 * cpu_us * n / 1e6 / wall:.0f}% of one core), of which script "
        f"execution {script_us:.1f} us (commands inside, us per timer: {inside}); "
        f"{count(scripts)} script calls")
    return script_us


def _since(ctx: Context, before: ServerSample) -> _Spent:
    return _Spent().add(before, ServerSample.take(ctx.r))


def run(ctx: Context) -> None:
    s = ctx.sizes
    args = args_100(1)

    ctx.fresh_db()
    print("- Schedule: single sync calls (timers and Huey, alternating)", flush=True)
    with ctx.timers() as t:
        contenders = {"timers": lambda: t.schedule(NOOP, args, in_=HOUR)}
        huey_call = _huey_schedule(ctx.url, args)
        if huey_call is not None:
            contenders["huey"] = huey_call
        done = _alternating(ctx, contenders, s.sync_s)
    n, wall, spent = done["timers"]
    rate = n / wall
    huey = done.get("huey")
    huey_rate = huey[0] / huey[1] if huey else None
    ctx.results.add(Row("Schedule: single sync schedule() calls", "schedules/s",
                        f"{count(rate)} ({count(n)} in {wall:.1f} s)",
                        ">= Huey in the same run",
                        rate >= huey_rate if huey_rate else None,
                        f"Huey {count(huey_rate)} in this run" if huey_rate
                        else "Huey 7,238 (huey not installed: an earlier run)"))
    if huey:
        ctx.results.add(Row("Schedule: Huey, single task.schedule(delay=3600) calls, same "
                            "server, alternating with the row above", "schedules/s",
                            f"{count(huey[0] / huey[1])} ({count(huey[0])} in {huey[1]:.1f} s)"))
        ctx.results.note("schedule, Huey: one LPUSH of a pickled message per call (its "
                         "consumer moves a delayed task to its schedule when it reads it); "
                         "timers: one script call that writes the timer's record, due index "
                         "entry and expiring key atomically")
    script_us = _redis_note(ctx, "single sync calls", spent, n, wall)
    _round_trip_floor(ctx, script_us)

    ctx.fresh_db()
    print(f"- Schedule: asyncio, {s.async_in_flight} in flight", flush=True)
    before = ServerSample.take(ctx.r)
    n, wall = asyncio.run(_async(ctx, s.async_s, s.async_in_flight))
    rate = n / wall
    ctx.results.add(Row(f"Schedule: AsyncTimers.schedule, {s.async_in_flight} in flight",
                        "schedules/s", f"{count(rate)} ({count(n)} in {wall:.1f} s)",
                        ">= 40,000", rate >= 40_000, "BullMQ 35,685 (ioredis pipelining)"))
    _redis_note(ctx, f"asyncio {s.async_in_flight} in flight", _since(ctx, before), n, wall)

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
    _redis_note(ctx, "schedule_many", _since(ctx, before), s.many_n, wall)


def _alternating(ctx: Context, calls: dict[str, Callable[[], object]], seconds: float,
                 rounds: int = 5) -> dict[str, tuple[int, float, _Spent]]:
    """Each call run back to back for ``seconds / rounds`` in turn, ``rounds`` times (so a
    slow spell of a shared machine falls on both): {name: (calls, seconds, Redis's cost)}."""
    done = {name: (0, 0.0, _Spent()) for name in calls}
    for call in calls.values():
        call()  # connect and load scripts outside the clock
    for _ in range(rounds):
        for name, call in calls.items():
            before = ServerSample.take(ctx.r)
            n, start = 0, time.perf_counter()
            end = start + seconds / rounds
            while time.perf_counter() < end:
                for _ in range(50):
                    call()
                n += 50
            took = time.perf_counter() - start
            total, wall, spent = done[name]
            done[name] = (total + n, wall + took, spent.add(before, ServerSample.take(ctx.r)))
    return done


def _huey_schedule(url: str, args: dict[str, Any]) -> Callable[[], object] | None:
    """Huey's ``task.schedule(delay=3600)`` on the same server, or None without huey."""
    try:
        from huey import RedisHuey
    except ImportError:
        return None
    huey = RedisHuey("bench-huey", url=url)

    @huey.task()
    def noop(**kwargs: Any) -> None:
        pass

    return lambda: noop.schedule(kwargs=args, delay=HOUR)


def _round_trip_floor(ctx: Context, script_us: float, n: int = 5_000) -> None:
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
        f"{count(rates[1])}/s ({1e6 / rates[1]:.0f} us); with the schedule script's own "
        f"{script_us:.1f} us of Redis time on top, a single call with no Python of timers' "
        f"would cost {1e6 / rates[1] + script_us:.0f} us: "
        f"{count(1e6 / (1e6 / rates[1] + script_us))}/s at most")


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
