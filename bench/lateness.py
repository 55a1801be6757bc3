"""Lateness: task start minus due time (``Fired.lateness_ms``, on the Redis clock).

Two loads, each with nothing else pending and with ``background_n`` other timers pending an
hour out (same prefix, so they sit in the same due index; a task that is never run, as they
never come due during the run). An hour out is the near horizon: they come within it as
the run goes, so the listeners key all of them (in paced batches, ``near.lua``) while
the lateness is measured, and their keys then sit in the same expire table:

- **spread**: ``spread_n`` timers due evenly over ``spread_s`` seconds, scheduled at once;
- **steady**: a producer (this process, single ``schedule()`` calls) schedules
  ``steady_rate`` timers a second for ``steady_s`` seconds, each 1-2 s ahead, while the
  listener (a child process) fires them.

Each timer gets ``at=`` its due time and carries it in its args, so the task also notes
how late it started by the system clock (the server's clock: same machine), a check that
does not depend on the listener's estimate of the Redis clock.
"""

from __future__ import annotations

import random
import time

from bench.common import NOOP, Deadline, Row, count, due_at, ms, shares
from bench.context import Context
from bench.procs import ListenerProc
from timers import TimerSpec
from timers.model.percentiles import percentile

PEER = "Celery 1/3, arq 340/590, Huey 564/996 (p50/p99 ms)"


def budget(ctx: Context) -> float:
    s = ctx.sizes
    load = s.background_n / 15_000
    return 2 * (s.spread_s + s.steady_s + 60) + load + 60


def run(ctx: Context) -> None:
    s = ctx.sizes
    for background in (0, s.background_n):
        ctx.fresh_db()
        label = f"{count(background)} pending" if background else "nothing else pending"
        if background:
            # Bulk load with AOF off, then AOF back on and its rewrite finished before
            # anything is measured (a fork writing the whole dataset would skew lateness).
            ctx.set_aof(False)
            loaded, seconds = ctx.bulk_load(background, deadline=Deadline(300))
            ctx.set_aof(True)
            ctx.results.note(f"lateness: loaded {count(loaded)} background timers in "
                             f"{seconds:.1f} s ({count(loaded / seconds)}/s, AOF off)")
        spread(ctx, background, label)
        steady(ctx, background, label)


def _rows(ctx: Context, name: str, proc: ListenerProc, expected: int,
          background: int, extra: str = "", target_p99: float = 10.0) -> None:
    res = proc.result()
    if res is None:
        ctx.results.add(Row(name, "lateness", "no report from the listener"))
        ctx.results.note(f"{name}: {proc.name}{proc.log_tail(5)}")
        return
    late = res.lateness_ms
    got = len(late)
    figures = (f"p50 {ms(percentile(late, 50))} / p90 {ms(percentile(late, 90))} / "
               f"p99 {ms(percentile(late, 99))} / max {ms(late[-1] if late else float('nan'))}"
               " ms")
    if got < expected:
        figures += f" (only {count(got)} of {count(expected)} fired by the deadline)"
    if background:
        target = f"p99 <= {target_p99:g} ms"
        met = got == expected and percentile(late, 99) <= target_p99
    else:
        target = "p50 <= 2 ms, p99 <= 10 ms"
        met = got == expected and percentile(late, 50) <= 2 and percentile(late, 99) <= 10
    ctx.results.add(Row(name, "lateness p50/p90/p99/max", figures, target, met, PEER))
    detail = shares(res.sources)
    own = sorted(res.task_lateness)
    if own:
        detail += (f"; by the task's own clock p50 {ms(percentile(own, 50))} / p99 "
                   f"{ms(percentile(own, 99))} / max {ms(own[-1])} ms")
    if res.failures:
        detail += f"; {res.failures} task failures"
    if extra:
        detail += f"; {extra}"
    ctx.results.add(Row(name, "fired by path", detail))


def spread(ctx: Context, background: int, label: str, target_p99: float = 10.0) -> None:
    s = ctx.sizes
    name = f"Lateness: {count(s.spread_n)} over {s.spread_s:g} s, {label}"
    print(f"- {name}", flush=True)
    ctx.mark()
    proc = ctx.listener(expect=s.spread_n)
    first = 1.0
    start_ms = ctx.redis_now_ms() + first * 1000
    dues = [round(start_ms + s.spread_s * 1000 * i / s.spread_n) for i in range(s.spread_n)]
    specs = [TimerSpec(NOOP, [i, due], at=due_at(due)) for i, due in enumerate(dues)]
    with ctx.timers() as t:
        t.schedule_many(specs)
    proc.wait_exit(first + s.spread_s + 15)
    _rows(ctx, name, proc, s.spread_n, background, target_p99=target_p99)


def steady(ctx: Context, background: int, label: str) -> None:
    s = ctx.sizes
    name = f"Lateness: steady {count(s.steady_rate)}/s for {s.steady_s:g} s, {label}"
    print(f"- {name}", flush=True)
    planned = round(s.steady_rate * s.steady_s)
    ctx.mark()
    proc = ctx.listener(expect=planned)
    rng = random.Random(7)
    sent = 0
    with ctx.timers() as t:
        start = time.monotonic()
        stop_at = start + s.steady_s + 5  # the producer may fall behind; not forever
        while sent < planned:
            now = time.monotonic()
            if now > stop_at:
                break
            owed = min(planned, int((now - start) * s.steady_rate) + 1)
            while sent < owed:
                due = round(time.time() * 1000 + rng.uniform(1000, 2000))
                t.schedule(NOOP, [sent, due], at=due_at(due))
                sent += 1
            time.sleep(max(0.0, start + sent / s.steady_rate - time.monotonic()))
        produced_s = time.monotonic() - start
    if sent < planned:
        # Fewer than planned: the child would wait for the rest; give it its due times.
        proc.wait_exit(3.0 + 10)
    else:
        proc.wait_exit(2.0 + 10)
    extra = f"producer sent {count(sent)} in {produced_s:.1f} s ({count(sent / produced_s)}/s)"
    _rows(ctx, name, proc, sent, background, extra)
