"""Fire throughput: N timers due at one instant, run by one (then two) listener processes.

The listeners start first; then this process schedules N timers (``schedule_many``, args
``[i, due_ms]``) at one moment far enough ahead that all are in before it. Figures: fires per
second = N / (last start - due time), the time from due to the last start, and Redis and
listener CPU per fire over the firing window.
"""

from __future__ import annotations

from bench.common import NOOP, Deadline, Row, count, due_at, ms, shares, wait_until
from bench.context import Context
from bench.procs import merge
from bench.server_stats import ServerSample, cpu_seconds
from timers import TimerSpec
from timers.model.percentiles import percentile

PEER = "Celery 2,115, SAQ 1,914, Huey 1,641"


def budget(ctx: Context) -> float:
    return sum(2 * (n / 20_000 + n / 1_000 + 30) for n in ctx.sizes.fire_ns) + 30


NOOP_CPU = "listener CPU us per no-op fire"
"""In :attr:`Context.figures`: one process, 20,000 due at once."""


def run(ctx: Context) -> None:
    for processes in (1, 2):
        for n in ctx.sizes.fire_ns:
            once(ctx, n, processes)


def once(ctx: Context, n: int, processes: int) -> None:
    name = (f"Fire: {count(n)} due at once, "
            f"{processes} listener process{'es' if processes > 1 else ''}")
    print(f"- {name}", flush=True)
    ctx.fresh_db()
    procs = [ctx.listener() for _ in range(processes)]
    lead = 1.5 + n / 25_000  # schedule_many does ~40k/s here; all are in before the due time
    due_ms = round(ctx.redis_now_ms() + lead * 1000)
    at = due_at(due_ms)
    with ctx.timers() as t:
        t.schedule_many([TimerSpec(NOOP, [i, due_ms], at=at) for i in range(n)])
    margin = due_ms - ctx.redis_now_ms()
    before = ServerSample.take(ctx.r)
    cpu_before = [_proc_cpu(p.pid) for p in procs]
    # Fired timers are counted by the listeners' finish batches in bench|stats.
    deadline = Deadline(margin / 1000 + 10 + n / 1_000)
    done = wait_until(
        lambda: ctx.fired_counter() >= n or not any(p.alive() for p in procs),
        deadline.left(), 0.1) and ctx.fired_counter() >= n
    after = ServerSample.take(ctx.r)
    cpu_after = [_proc_cpu(p.pid) for p in procs]
    results = [p.result() for p in procs]
    if any(r is None for r in results):
        ctx.results.add(Row(name, "fires/s", "a listener wrote no report"))
        for p in procs:
            if p.log_tail():
                ctx.results.note(f"{name}: {p.name}{p.log_tail(5)}")
        return
    res = merge([r for r in results if r is not None])
    got = len(res.fired)
    if not got:
        ctx.results.add(Row(name, "fires/s", "nothing fired"))
        return
    last_start = max(started for _, started, _, _ in res.fired)
    span_ms = last_start - due_ms
    rate = got / (span_ms / 1000) if span_ms > 0 else float("inf")
    result = f"{count(rate)} ({count(got)} in {span_ms / 1000:.2f} s)"
    if not done or got < n:
        result += f" - only {count(got)} of {count(n)} by the deadline"
    target_ok = done and got >= n and rate >= 10_000
    is_target = n == 20_000 and processes == 1
    ctx.results.add(Row(name, "fires/s (N / (last start - due))", result,
                        ">= 10,000" if is_target else "", target_ok if is_target else None,
                        PEER))
    late = res.lateness_ms
    own = sorted(res.task_lateness)
    own_text = (f"; by the task's own clock p50 {ms(percentile(own, 50))}, last "
                f"{ms(own[-1])} ms" if own else "")
    per_proc = ", ".join(count(len(r.fired)) for r in results if r is not None)
    ctx.results.add(Row(name, "due -> last start; lateness p50", (
        f"{ms(span_ms)} ms; p50 {ms(percentile(late, 50))} ms{own_text}; {shares(res.sources)}"
        + (f"; per process {per_proc}" if processes > 1 else ""))))
    if margin < 0:
        ctx.results.note(f"{name}: scheduling ended {-margin:.0f} ms after the due time")
    redis_cpu = (after.cpu_s - before.cpu_s) / got * 1e6
    listener_cpu = sum(a - b for a, b in zip(cpu_after, cpu_before, strict=True)) / got * 1e6
    if is_target:
        ctx.figures[NOOP_CPU] = listener_cpu
    calls = after.calls_since(before)
    evalsha = sum(calls.get(name, 0) for name in ("fcall", "evalsha", "eval"))
    ctx.results.note(
        f"{name}: per fire, Redis CPU {redis_cpu:.1f} us and listener CPU "
        f"{listener_cpu:.1f} us (over {(after.at - before.at):.1f} s); "
        f"{count(evalsha)} script calls ({got / max(evalsha, 1):.1f} fires per call); "
        f"events delivered: {_expired_share(res.sources)}")


def _expired_share(sources: list[str]) -> str:
    return f"{sum(1 for s in sources if s == 'event'):,} of {len(sources):,} fired by event"


def _proc_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0
