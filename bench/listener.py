"""A listener child process: ``python -m bench.listener --url URL --out FILE …``.

It runs one :class:`timers.Listener` with the trivial task ``noop`` (and the flow-limited
``flow.keyed`` and ``flow.rated``) registered, keeps one tuple per run from the observer
(due ms, start ms, path, ok, and id, due, start, end ms), touches ``--ready`` once it is
subscribed, and on exit (``--expect`` runs seen, SIGTERM, ``--max-seconds``, or its parent
gone) writes them to ``--out`` as JSON with its CPU time. Nothing is written to Redis, so
the listener's own traffic is all the server sees from this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timers
from timers.listener import Listener
from timers.listener.tuning import collector
from timers.model.runs import Fired

TASK_LATENESS: list[float] = []
"""Per run whose args end in its due time (epoch ms): the task's own start minus due."""


def noop(*args: Any, **kwargs: Any) -> None:
    """The trivial task. Given ``[i, due_ms]`` it notes how late it started by the system
    clock (the server's clock too: same machine), independently of the listener's estimate.
    """
    if len(args) == 2 and isinstance(args[1], int):
        TASK_LATENESS.append(time.time() * 1000 - args[1])


@timers.task(concurrency=1, key=lambda key, ms=0: key)
def keyed(key: str, ms: float = 0) -> None:
    """One run at a time per ``key`` fleet-wide; sleeps ``ms`` milliseconds."""
    if ms:
        time.sleep(ms / 1000)


@timers.task(rate="500/s")
def rated(i: int) -> None:
    """Started at most 500 times a second fleet-wide (one every 2 ms)."""


SINK_ENV = "BENCH_SINK_URL"
"""The second server the workload tasks write to (the broker holds only timers' data)."""
SINK_LIST = "bench:pushed"
_sink: dict[str, Any] = {}


def push(seq: int, due_ms: int, payload: str) -> None:
    """The peers' workload as a plain sync task: note the start time and RPUSH
    ``seq,due_ms,start_ms`` to the sink server."""
    start_ms = time.time() * 1000
    client = _sink.get("sync")
    if client is None:
        import redis

        client = _sink["sync"] = redis.Redis.from_url(os.environ[SINK_ENV])
    client.rpush(SINK_LIST, f"{seq},{due_ms},{start_ms:.3f}")


async def apush(seq: int, due_ms: int, payload: str) -> None:
    """The same as an ``async def`` task with an asyncio client."""
    start_ms = time.time() * 1000
    client = _sink.get("async")
    if client is None:
        import redis.asyncio

        client = _sink["async"] = redis.asyncio.Redis.from_url(os.environ[SINK_ENV])
    await client.rpush(SINK_LIST, f"{seq},{due_ms},{start_ms:.3f}")


async def close_async_sink() -> None:
    """Close ``apush``'s client (it belongs to the loop that made it), if there is one."""
    client = _sink.pop("async", None)
    if client is not None:
        await client.aclose()


TASKS: dict[str, Callable[..., Any]] = {
    "noop": noop, "flow.keyed": keyed, "flow.rated": rated, "sink.push": push,
    "sink.apush": apush,
}


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def listen(
    url: str, prefix: str, concurrency: int, expect: int, ready: Path, max_seconds: float,
    metrics: bool = False,
) -> dict[str, Any]:
    fired: list[tuple[int, float, str, bool]] = []
    runs: list[tuple[str, int, float, float]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def observe(f: Fired) -> None:
        fired.append((f.due_ms, f.started_ms, f.source, f.outcome.ok))
        runs.append((f.timer_id, f.due_ms, f.started_ms, f.finished_ms))
        if expect and len(fired) >= expect:
            stop.set()

    listener = Listener(
        url, prefix=prefix, registry=TASKS, concurrency=concurrency,
        observer=observe, shutdown_timeout=5.0,
    )
    cpu_ready = _cpu()
    helpers: list[asyncio.Task[None]] = []
    if metrics:  # what `timers listen --metrics-port` adds (the port itself idles unscraped)
        from timers.observe.listener_metrics import ListenerMetrics

        recorder = ListenerMetrics()
        listener.tally.observers.append(recorder)
        helpers.append(asyncio.create_task(recorder.sample(
            lambda: listener.load()[0], lambda: listener.load()[1], stop)))

    async def mark_ready() -> None:
        nonlocal cpu_ready
        await listener.subscribed.wait()
        collector.tune()  # as `timers listen` does once the app is imported
        cpu_ready = _cpu()
        _write(ready, str(os.getpid()))

    async def watchdog() -> None:
        parent = os.getppid()
        end = time.monotonic() + max_seconds
        while True:
            await asyncio.sleep(0.5)
            if os.getppid() != parent or time.monotonic() >= end:
                stop.set()
                return

    helpers += [asyncio.create_task(mark_ready()), asyncio.create_task(watchdog())]
    try:
        await listener.run(stop)
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
    return {
        "fired": fired,
        "cpu_s": _cpu() - cpu_ready,
        "finished": bool(expect) and len(fired) >= expect,
        "task_lateness": TASK_LATENESS,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.listener")
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--expect", type=int, default=0, help="exit after this many runs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--metrics", action="store_true", help="record Prometheus metrics")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    report = asyncio.run(listen(opts.url, opts.prefix, opts.concurrency, opts.expect,
                                opts.ready, opts.max_seconds, opts.metrics))
    tmp = opts.out.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.write_text(json.dumps(report))
    tmp.replace(opts.out)


if __name__ == "__main__":
    main()
