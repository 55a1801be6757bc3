"""Memory: Redis bytes per pending timer (INFO used_memory delta / N), 100-byte args.

Timers are scheduled with ``schedule_many`` (task ``reminders.sms``, args of exactly 100
bytes as JSON) on an empty database with AOF off, so the AOF buffers are not counted: a
day out (beyond the near horizon: no expiring key yet), and, for the first size, 30
minutes out (within it: keyed). The notes split one timer's cost over the structures.
"""

from __future__ import annotations

from bench.common import PREFIX, Deadline, Row, count
from bench.context import Context
from timers.model.keys import Keyspace

TASK = "reminders.sms"


DAY = 86_400.0
TARGET = 350


def budget(ctx: Context) -> float:
    return sum(n / 10_000 for n in ctx.sizes.memory_ns) + ctx.sizes.memory_ns[0] / 10_000 + 60


def run(ctx: Context) -> None:
    plan = [(n, DAY, "a day out") for n in ctx.sizes.memory_ns]
    plan.append((ctx.sizes.memory_ns[0], 1800.0, "30 min out, keyed"))
    for n, in_, when in plan:
        name = f"Memory: {count(n)} pending {when}, 100 B args"
        print(f"- {name}", flush=True)
        ctx.fresh_db(aof=False)
        before = ctx.used_memory()
        loaded, seconds = ctx.bulk_load(n, task=TASK, in_=in_,
                                        deadline=Deadline(n / 5_000 + 30))
        after = ctx.used_memory()
        per = (after - before) / loaded
        result = f"{per:,.0f} B/timer ({(after - before) / 2**20:,.0f} MiB for {count(loaded)})"
        if loaded < n:
            result += f" - only {count(loaded)} of {count(n)} loaded by the deadline"
        if in_ == DAY:
            ctx.results.add(Row(name, "Redis bytes per pending timer", result, f"<= {TARGET}",
                                per <= TARGET and loaded == n, "Huey 285, arq 506, Dramatiq 529"))
        else:  # the near ones: the target is for timers at rest, far out
            ctx.results.add(Row(name, "Redis bytes per pending timer", result))
        ctx.results.note(f"{name}: {_breakdown(ctx, loaded, per)}; loaded at "
                         f"{count(loaded / seconds)}/s")


def _breakdown(ctx: Context, n: int, per: float) -> str:
    """MEMORY USAGE of one timer key, and of the due index and records hash per timer."""
    k = Keyspace(PREFIX)
    head = ctx.r.zrange(k.due, 0, 0)
    if not head:
        return "no timers to sample"
    record = ctx.r.hget(k.records, head[0])
    key = k.timer_key(f"{head[0]}:{record}")
    key_bytes = ctx.r.memory_usage(key) or 0  # 0: no key yet (beyond the near horizon)
    due = (ctx.r.memory_usage(k.due, samples=1000) or 0) / n
    records = (ctx.r.memory_usage(k.records, samples=1000) or 0) / n
    rest = per - key_bytes - due - records
    return (f"expiring key {key_bytes} B (name {len(key)} chars), due index {due:.0f} B, "
            f"records hash {records:.0f} B (value {len(record or '')} chars), "
            f"expires table and the rest ~{rest:.0f} B")
