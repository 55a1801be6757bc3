"""Flow control: fires/s through a concurrency key and through a rate limit, and how soon a
waiting timer starts once its slot frees. Two listener processes (four for the handoff).

- Keyed handoff: N timers over 50 keys (concurrency 1 per key: ``flow.keyed`` in
  bench/listener.py), each run sleeping 20 ms, all due at one instant, with two listener
  processes (one per core here) and with four (the issue's case). Figures: the time
  from the due time to the last end against the ideal (N/50 runs x 20 ms, keys in
  parallel), and the handoff per key: a run's start minus the end of the run before it
  (what a waiting timer waits once its slot frees; target p99 <= 10 ms).
- Keyed throughput: N timers with a key each (every run asks the gate, none waits), no
  sleep: fires/s through a concurrency key, to set against the unlimited "Fire" rows.
- Rate: N timers due at once through a 500/s limit (``flow.rated``): starts per second, the
  busiest 1 s, and how late each start is after its slot (first start + i x 2 ms). Slots
  are 2 ms apart exactly; a start comes a little after its slot (its lateness), so a 1 s
  window of starts may hold one more than the limit allows slots for.
"""

from __future__ import annotations

import itertools

from bench.common import Deadline, Row, count, ms, wait_until
from bench.context import Context
from bench.procs import ListenerResult, merge
from timers import TimerSpec
from timers.model.percentiles import percentile

KEYS = 50
SLEEP_MS = 20
RATE_INTERVAL_MS = 2  # flow.rated: 500/s


def sizes(ctx: Context) -> tuple[int, int, int]:
    """(keyed handoff N, keyed throughput N, rate N)."""
    return (1_000, 5_000, 500) if ctx.sizes.quick else (5_000, 20_000, 2_000)


def budget(ctx: Context) -> float:
    handoff, through, rated = sizes(ctx)
    return 4 * 30 + 2 * handoff * SLEEP_MS / KEYS / 1000 * 3 + through / 500 + rated / 100


def run(ctx: Context) -> None:
    handoff, through, rated = sizes(ctx)
    keyed_handoff(ctx, handoff, 2)  # one listener process per core
    keyed_handoff(ctx, handoff, 4)  # the case: more processes than cores
    keyed_throughput(ctx, through)
    rate_limited(ctx, rated)


def _fire(ctx: Context, specs: list[TimerSpec], n: int, lead: float,
          listeners: int = 2) -> tuple[ListenerResult | None, float]:
    """Start listeners, schedule ``specs`` due ``lead`` s from now, wait for n fires."""
    ctx.fresh_db()
    procs = [ctx.listener() for _ in range(listeners)]
    due_ms = ctx.redis_now_ms() + lead * 1000
    with ctx.timers() as t:
        t.schedule_many(specs)
    deadline = Deadline(lead + 30 + n / 200)
    wait_until(lambda: ctx.fired_counter() >= n or not all(p.alive() for p in procs),
               deadline.left(), 0.05)
    results = [p.result() for p in procs]
    if any(r is None for r in results):
        return None, due_ms
    return merge([r for r in results if r is not None]), due_ms


def keyed_handoff(ctx: Context, n: int, listeners: int) -> None:
    name = (f"Flow: {count(n)} due at once over {KEYS} keys, 1 at a time per key, "
            f"{SLEEP_MS} ms, {listeners} listener processes")
    print(f"- {name}", flush=True)
    specs = [TimerSpec("flow.keyed", [f"k{i % KEYS}", SLEEP_MS], id=f"k{i % KEYS}-{i:06}",
                       in_=1.5) for i in range(n)]
    res, _ = _fire(ctx, specs, n, 1.5, listeners)
    if res is None or len(res.runs) < n:
        ctx.results.add(Row(name, "runs", "a listener failed or runs are missing"))
        return
    by_key: dict[str, list[tuple[float, float]]] = {}
    for timer_id, _, start, end in res.runs:
        by_key.setdefault(timer_id.split("-")[0], []).append((start, end))
    handoffs = sorted(s2 - e1 for spans in map(sorted, by_key.values())
                      for (_, e1), (s2, _) in itertools.pairwise(spans))
    first_due = min(due for _, due, _, _ in res.runs)
    total = max(end for *_, end in res.runs) - first_due
    ideal = n / KEYS * SLEEP_MS
    firsts = sorted(min(spans)[0] - first_due for spans in by_key.values())
    waits = sorted(sum(s2 - e1 for (_, e1), (s2, _) in itertools.pairwise(sorted(spans)))
                   for spans in by_key.values())
    dispatched = first_due + firsts[-1]
    settled = sorted(s2 - e1 for spans in map(sorted, by_key.values())
                     for (_, e1), (s2, _) in itertools.pairwise(spans) if e1 > dispatched)
    if settled:
        ctx.results.note(f"{name}: handoffs after every key's first start (the burst "
                         f"dispatched): p50 {ms(percentile(settled, 50))} ms, p99 "
                         f"{ms(percentile(settled, 99))} ms ({count(len(settled))} handoffs)")
    ctx.results.note(f"{name}: first start per key after the due time p50 "
                     f"{ms(percentile(firsts, 50))} / max {ms(firsts[-1])} ms; handoffs per "
                     f"key add up to p50 {ms(percentile(waits, 50))} / max {ms(waits[-1])} ms")
    ctx.results.add(Row(name, "due -> last end (ideal: runs per key x 20 ms)",
                        f"{ms(total)} ms vs ideal {ms(ideal)} ms ({total / ideal:.0%})",
                        "<= 125%", total <= 1.25 * ideal))
    ctx.results.add(Row(name, "handoff: next start - previous end, per key",
                        f"p50 {ms(percentile(handoffs, 50))} ms, p99 "
                        f"{ms(percentile(handoffs, 99))} ms, max {ms(handoffs[-1])} ms",
                        "p99 <= 10 ms", percentile(handoffs, 99) <= 10))


def keyed_throughput(ctx: Context, n: int) -> None:
    name = f"Flow: {count(n)} due at once, each through a concurrency key of its own"
    print(f"- {name}", flush=True)
    lead = 1.5 + n / 25_000
    specs = [TimerSpec("flow.keyed", [f"own{i}"], in_=lead) for i in range(n)]
    res, due_ms = _fire(ctx, specs, n, lead)
    if res is None or not res.runs:
        ctx.results.add(Row(name, "fires/s", "a listener failed"))
        return
    span = max(start for _, _, start, _ in res.runs) - due_ms
    late = sorted(start - due for _, due, start, _ in res.runs)
    ctx.results.add(Row(name, "fires/s (N / (last start - due))",
                        f"{count(len(res.runs) / (span / 1000))} ({count(len(res.runs))} in "
                        f"{span / 1000:.2f} s); lateness p50 {ms(percentile(late, 50))} ms"))


def rate_limited(ctx: Context, n: int) -> None:
    name = f"Flow: {count(n)} due at once through a rate limit of 500/s"
    print(f"- {name}", flush=True)
    specs = [TimerSpec("flow.rated", [i], in_=1.5) for i in range(n)]
    res, _ = _fire(ctx, specs, n, 1.5)
    if res is None or len(res.runs) < n:
        ctx.results.add(Row(name, "runs", "a listener failed or runs are missing"))
        return
    starts = sorted(start for _, _, start, _ in res.runs)
    busiest = max(sum(1 for s in starts[i:i + 1000] if s < first + 1000)
                  for i, first in enumerate(starts))
    behind = sorted(s - (starts[0] + i * RATE_INTERVAL_MS) for i, s in enumerate(starts))
    rate = (len(starts) - 1) / ((starts[-1] - starts[0]) / 1000)
    ctx.results.add(Row(name, "starts/s; busiest 1 s (of starts, each a little after its slot)",
                        f"{count(rate)}/s; {busiest} in the busiest second",
                        "<= 500 + burst 1 + 1 (a start's own lateness)", busiest <= 502))
    ctx.results.add(Row(name, "start - its slot (first start + i x 2 ms)",
                        f"p50 {ms(percentile(behind, 50))} ms, p99 "
                        f"{ms(percentile(behind, 99))} ms"))
