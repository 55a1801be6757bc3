"""Fires/s with a real task: the peers' workload, next to the no-op "Fire" rows.

Every timer carries ``seq``, ``due_ms`` and a 100-character string; the task takes
``time.time()`` and RPUSHes ``"seq,due_ms,start_ms"`` to a **second** server (so the broker
holds only timers' own data) and does nothing else: ``sink.push`` is a plain sync function
(it runs in the listener's thread pool), ``sink.apush`` the same as ``async def`` with an
asyncio client (it runs on the listener's event loop). One listener process with the
default settings; N timers due at one instant. Figures: fires/s = N / (last start - due),
by the starts the tasks wrote to the sink; CPU per fire of the listener and of Redis; and,
where ``py-spy`` is installed, the listener's CPU split by who was on the stack: the task
(its RPUSH included), redis-py (timers' own calls), timers' code, and the rest of Python
(asyncio, threads, the standard library).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import redis

from bench import task_alone
from bench.common import Deadline, Row, count, due_at, wait_until
from bench.context import Context
from bench.fire import NOOP_CPU
from bench.listener import SINK_ENV, SINK_LIST
from bench.server_stats import ServerSample, cpu_seconds
from timers import TimerSpec
from timers.dev.server import EmbeddedServer
from timers.model.encoding import as_text

PAYLOAD = "p" * 100
PEERS = {"sink.push": "Celery 2,279, Huey 1,830 (sync task)",
         "sink.apush": "BullMQ 14,110 (async processor, concurrency 50)"}
TARGETS = {"sink.push": 10_000, "sink.apush": 15_000}


def size(ctx: Context) -> int:
    return 5_000 if ctx.sizes.quick else 20_000


def budget(ctx: Context) -> float:
    return 4 * (size(ctx) / 1_000 + 40)


def run(ctx: Context) -> None:
    sink = EmbeddedServer().start()
    os.environ[SINK_ENV] = sink.url
    try:
        for task in ("sink.push", "sink.apush"):
            once(ctx, sink, task, size(ctx))
            once(ctx, sink, task, size(ctx), profiled=True)
            alone(ctx, task, size(ctx))
    finally:
        os.environ.pop(SINK_ENV, None)
        sink.stop()


def alone(ctx: Context, task: str, n: int) -> None:
    """The floor: the same task with nothing of timers around it (:mod:`bench.task_alone`)."""
    sync = task == "sink.push"
    counts = sorted({ctx.concurrency, 4}) if sync else [ctx.concurrency]
    runner = task_alone.threads if sync else task_alone.coroutines
    unit = "threads" if sync else "coroutines"
    measured = {c: runner(n, c) for c in counts}
    figures = "; ".join(f"{c} {unit}: {count(rate)}/s, {cpu:.0f} us CPU per call"
                        for c, (rate, cpu) in measured.items())
    noop = ctx.figures.get(NOOP_CPU)
    cpu = measured[ctx.concurrency][1]
    ceiling = (f"; with the listener's {noop:.0f} us per no-op fire (Fire row), one process "
               f"sharing a GIL cannot pass {count(1e6 / (cpu + noop))}/s" if noop else "")
    ctx.results.add(Row(f"Floor: the same {'sync' if sync else 'async def'} task alone, "
                        f"{count(n)} calls, no timers", "calls/s; CPU per call",
                        figures + ceiling))


def once(ctx: Context, sink: EmbeddedServer, task: str, n: int, profiled: bool = False) -> None:
    """One firing; ``profiled``: again under py-spy, for the split only (sampling with
    ``--gil`` slows the listener, so its figures are not reported)."""
    kind = "sync" if task == "sink.push" else "async def"
    name = f"Fire, real {kind} task (RPUSH to a second server): {count(n)} due at once, 1 process"
    print(f"- {name}{' (profiled)' if profiled else ''}", flush=True)
    ctx.fresh_db()
    sink_r = redis.Redis.from_url(sink.url, decode_responses=True)
    sink_r.delete(SINK_LIST)
    proc = ctx.listener()
    lead = 1.5 + n / 25_000
    due_ms = round(ctx.redis_now_ms() + lead * 1000)
    with ctx.timers() as t:
        t.schedule_many([TimerSpec(task, [i, due_ms, PAYLOAD], at=due_at(due_ms))
                         for i in range(n)])
    profile = (_Profile.start(proc.pid, ctx.workdir / f"profile-{task}.txt") if profiled
               else _Profile(None, ctx.workdir))
    before, cpu_before = ServerSample.take(ctx.r), cpu_seconds(proc.pid)
    done = wait_until(lambda: sink_r.llen(SINK_LIST) >= n,
                      Deadline(lead + 10 + n / 1_000).left(), 0.05)
    after, cpu_after = ServerSample.take(ctx.r), cpu_seconds(proc.pid)
    split = profile.stop()
    starts = [float(as_text(line).split(",")[2]) for line in sink_r.lrange(SINK_LIST, 0, -1)]
    sink_r.close()
    if profiled:
        ctx.results.note(f"{name}: Python time holding the GIL, by who was on the stack "
                         f"(py-spy --gil, a second run): {split or 'py-spy not installed'}")
        return
    if not starts:
        ctx.results.add(Row(name, "fires/s", "nothing fired"))
        return
    span_ms = max(starts) - due_ms
    rate = len(starts) / (span_ms / 1000) if span_ms > 0 else float("inf")
    result = f"{count(rate)} ({count(len(starts))} in {span_ms / 1000:.2f} s)"
    if not done:
        result += f" - only {count(len(starts))} of {count(n)} by the deadline"
    target = TARGETS[task]
    ctx.results.add(Row(name, "fires/s (N / (last start - due), starts by the task)",
                        result, f">= {count(target)}", done and rate >= target, PEERS[task]))
    got = len(starts)
    ctx.results.note(
        f"{name}: per fire, listener CPU {(cpu_after - cpu_before) / got * 1e6:.1f} us, "
        f"Redis (broker) CPU {(after.cpu_s - before.cpu_s) / got * 1e6:.1f} us")


class _Profile:
    """``py-spy record`` of the listener over the firing window, when py-spy is here."""

    def __init__(self, process: subprocess.Popen[bytes] | None, out: Path) -> None:
        self.process, self.out = process, out

    @classmethod
    def start(cls, pid: int, out: Path) -> _Profile:
        spy = shutil.which("py-spy") or _beside_python("py-spy")
        if spy is None:
            return cls(None, out)
        process = subprocess.Popen(
            [spy, "record", "--nonblocking", "--gil", "-r", "200", "-f", "raw", "-o", str(out),
             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return cls(process, out)

    def stop(self) -> str:
        if self.process is None:
            return ""
        self.process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(20)
        if not self.out.exists():
            return ""
        return split_text(self.out.read_text())


def _beside_python(name: str) -> str | None:
    import sys

    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else None


def who(stack: list[str]) -> str:
    """The owner of one sampled stack (frames root first, "func (file:line)")."""
    if any(frame.startswith(("push (", "apush (")) and "bench/listener.py" in frame
           for frame in stack):
        return "the task"
    for frame in reversed(stack):
        place = frame.rpartition("(")[2]
        if place.startswith("redis/") or "/redis/" in place:
            return "redis-py"
        if place.startswith("timers/") or "/timers/" in place:
            return "timers"
    return "Python runtime"


def split_text(raw: str) -> str:
    """``timers 41%, redis-py 22%, …`` from py-spy's raw output (idle stacks left out)."""
    owners: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        frames = stack.split(";")
        if any(idle in frames[-1] for idle in ("select (selectors", "wait (threading",
                                                "_work (timers/listener/calling/runner.py")):
            continue
        owners[who(frames)] += int(samples)
    total = sum(owners.values())
    if not total:
        return ""
    return ", ".join(f"{owner} {100 * n / total:.0f}%" for owner, n in owners.most_common())
