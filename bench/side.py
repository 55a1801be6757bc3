"""One side of a same-sitting comparison: ``python -P bench/side.py SCENARIO --url URL …``.

Run by :mod:`bench.compare` with the python of the side measured (the working tree's venv,
or a venv holding an earlier commit), so ``import timers`` loads that side's code. It is a
standalone script on purpose: it imports nothing from ``bench`` and only the public API
that every version since 2026-11-23 has (``Timers``, ``AsyncTimers``, ``TimerSpec``,
``Listener``), and ``-P`` keeps the script's folder and the working directory off
``sys.path``. It prints one JSON object of figures on its last line of stdout.

Scenarios (each bounded in count and time):

- ``single``: sync ``Timers.schedule()`` calls one after another for ``--seconds``;
- ``bulk``: one ``schedule_many`` of ``--n`` specs, built before the clock starts; with
  ``--batch B``, ``schedule_many`` calls of B timers each, one after another, until ``--n``
  timers or ``--seconds`` (``--aio``: ``AsyncTimers.schedule_many``, awaited one at a time);
- ``async``: ``AsyncTimers.schedule`` with ``--in-flight`` calls in flight for ``--seconds``
  (each call's latency taken: p50 and p99);
- ``bare``: the floor under ``async``: a plain ``redis.asyncio`` client sending the same
  script call (FCALL or EVALSHA, the keys and arguments timers builds, prepared before the
  clock by the working tree's code) ``--in-flight`` at once for ``--seconds``; with
  ``--in-flight 0``, the floor under ``single``: a plain ``redis.Redis`` client sending
  them one after another;
- ``fire``: ``--n`` timers due at one instant, one listener process (``listen``, a child of
  this one) with ``--task push`` (a plain function) or ``apush`` (``async def``): each run
  RPUSHes ``seq,due_ms,start_ms`` to a second server (``--sink``). Fires/s is
  N / (last start - due), first start is the first start - due, by the tasks' own clock;
- ``alone``: the floor under ``fire``: the same task ``--n`` times with nothing of timers
  around it, ``push`` from 32 threads, ``apush`` from 50 coroutines on the event loop a
  listener runs (uvloop when installed).

Every timer has 100-byte args and the ``bench`` prefix; producers' timers are an hour out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

PREFIX = "bench"
HOUR = 3600.0
SINK_LIST = "bench:pushed"
SINK_ENV = "BENCH_SINK_URL"
HISTORY_ENV = "BENCH_HISTORY"
"""``off``: the listener keeps no run history and no series (``compare --history-off``)."""
CONCURRENCY_ENV = "BENCH_CONCURRENCY"
LISTENERS_ENV = "BENCH_LISTENERS"
"""``fire``: how many listener processes share the fires (default 1); the runs at once
(:data:`ASYNC_CONCURRENCY` for ``apush``) are split between them."""
"""The listener's concurrency (unset: the default, 32; :data:`ASYNC_CONCURRENCY` for the
``async def`` fires)."""
ASYNC_CONCURRENCY = 50
"""The ``async def`` fires run 50 at once, as BullMQ's worker does in
``bullmq_side.cjs``: the same number in flight on both sides (32, the listener's default,
gave 0.85x the fires/s of 50 in one sitting, 6 runs each)."""
PAYLOAD = "p" * 100
ARGS = {"user_id": 1, "text": "x" * 87}
"""Exactly 100 bytes as compact JSON (the bench's ``args_100``)."""


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- producers --------------------------------------------------------------------------


def single(url: str, seconds: float, max_n: int) -> dict[str, float]:
    from timers import Timers

    with Timers(url, prefix=PREFIX) as t:
        for _ in range(50):  # connect and load the script outside the clock
            t.schedule("noop", ARGS, in_=HOUR)
        n, c0, start = 0, cpu_s(), time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end and n < max_n:
            for _ in range(50):
                t.schedule("noop", ARGS, in_=HOUR)
            n += 50
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
    return {"rate": n / wall, "n": n, "client_cpu_us": cpu / n * 1e6}


def _specs(n: int) -> list[Any]:
    from timers import TimerSpec

    return [TimerSpec("noop", {"user_id": i, "text": "x" * (88 - len(str(i)))}, in_=HOUR)
            for i in range(n)]


def bulk(url: str, n: int) -> dict[str, float]:
    from timers import Timers

    specs = _specs(n)
    with Timers(url, prefix=PREFIX) as t:
        t.schedule("noop", ARGS, in_=HOUR)
        c0, start = cpu_s(), time.perf_counter()
        t.schedule_many(specs)
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
    return {"rate": n / wall, "n": n, "client_cpu_us": cpu / n * 1e6}


def batches(url: str, n: int, batch: int, seconds: float) -> dict[str, float]:
    """``schedule_many`` calls of ``batch`` timers one after another (the specs built before
    the clock), until ``n`` timers or ``seconds``."""
    from timers import Timers

    calls = [_specs(batch) for _ in range(max(n // batch, 1))]
    with Timers(url, prefix=PREFIX) as t:
        t.schedule_many(_specs(min(batch, 100)))
        done, c0, start = 0, cpu_s(), time.perf_counter()
        end = start + seconds
        for specs in calls:
            t.schedule_many(specs)
            done += batch
            if time.perf_counter() > end:
                break
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
    return {"rate": done / wall, "n": done, "client_cpu_us": cpu / done * 1e6}


async def _abatches(url: str, n: int, batch: int, seconds: float) -> dict[str, float]:
    """:func:`batches` with ``AsyncTimers.schedule_many``, awaited one at a time."""
    from timers import AsyncTimers

    calls = [_specs(batch) for _ in range(max(n // batch, 1))]
    async with AsyncTimers(url, prefix=PREFIX) as t:
        await t.schedule_many(_specs(min(batch, 100)))
        done, c0, start = 0, cpu_s(), time.perf_counter()
        end = start + seconds
        for specs in calls:
            await t.schedule_many(specs)
            done += batch
            if time.perf_counter() > end:
                break
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
    return {"rate": done / wall, "n": done, "client_cpu_us": cpu / done * 1e6}


def _latency_figures(done: int, wall: float, cpu: float,
                     latencies: list[float]) -> dict[str, float]:
    latencies.sort()

    def at(q: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(int(len(latencies) * q), len(latencies) - 1)] * 1e6

    return {"rate": done / wall, "n": done, "client_cpu_us": cpu / max(done, 1) * 1e6,
            "p50_us": at(0.5), "p99_us": at(0.99)}


async def _async(url: str, seconds: float, in_flight: int, max_n: int) -> dict[str, float]:
    from timers import AsyncTimers

    done = 0
    latencies: list[float] = []
    async with AsyncTimers(url, prefix=PREFIX) as t:
        for _ in range(20):  # connect, read the eviction policy, load the script
            await asyncio.gather(*(t.schedule("noop", ARGS, in_=HOUR)
                                   for _ in range(in_flight)))
        c0, start = cpu_s(), time.perf_counter()
        end = start + seconds
        clock = time.perf_counter

        async def worker() -> None:
            nonlocal done
            while (sent := clock()) < end and done < max_n:
                await t.schedule("noop", ARGS, in_=HOUR)
                latencies.append(clock() - sent)
                done += 1

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
    return _latency_figures(done, wall, cpu, latencies)


def _prepared(t: Any, max_n: int) -> list[tuple[Any, ...]]:
    """``max_n`` script calls as ``schedule("noop", ARGS, in_=HOUR)`` sends them, built by
    ``t`` (a ``Timers`` or ``AsyncTimers`` that has scheduled once, so its script is
    loaded): ``FCALL`` or ``EVALSHA`` with the keys and arguments timers builds."""
    from timers import TimerSpec
    from timers.store.lua_library import Function

    commands = []
    for _ in range(max_n):
        ops: Any = getattr(t.ops, "_single", None) or t.ops
        call = ops._schedule_call([ops.prepare(TimerSpec("noop", ARGS, in_=HOUR))])
        script = t._scripts[call.script]
        head = (("FCALL", script.name) if isinstance(script, Function)
                else ("EVALSHA", script.sha))
        commands.append((*head, len(call.keys), *call.keys, *call.args))
    return commands


def bare_single(url: str, seconds: float, max_n: int) -> dict[str, float]:
    """The floor under :func:`single`: the same script call by a plain ``redis.Redis``
    client, one after another (the working tree's code builds the calls, before the clock)."""
    import redis

    from timers import Timers

    with Timers(url, prefix=PREFIX) as t:
        t.schedule("noop", ARGS, in_=HOUR)
        commands = _prepared(t, max_n)
    r = redis.Redis.from_url(url)
    for command in commands[:50]:
        r.execute_command(*command)
    done, latencies = 0, []
    c0, start = cpu_s(), time.perf_counter()
    end = start + seconds
    clock = time.perf_counter
    for command in commands[50:]:
        sent = clock()
        if sent >= end:
            break
        r.execute_command(*command)
        latencies.append(clock() - sent)
        done += 1
    wall, cpu = time.perf_counter() - start, cpu_s() - c0
    r.close()
    return _latency_figures(done, wall, cpu, latencies)


async def _bare(url: str, seconds: float, in_flight: int, max_n: int) -> dict[str, float]:
    """The floor under :func:`_async`: the same script call by a plain ``redis.asyncio``
    client (the working tree's code builds the calls, before the clock)."""
    import redis.asyncio

    from timers import AsyncTimers

    async with AsyncTimers(url, prefix=PREFIX) as t:
        await t.schedule("noop", ARGS, in_=HOUR)  # the script (or library) loaded
        commands = _prepared(t, max_n)
    r = redis.asyncio.Redis.from_url(url)
    for command in commands[:in_flight * 20]:
        await r.execute_command(*command)  # type: ignore[no-untyped-call]
    todo = iter(commands[in_flight * 20:])
    done = 0
    latencies: list[float] = []
    c0, start = cpu_s(), time.perf_counter()
    end = start + seconds
    clock = time.perf_counter

    async def worker() -> None:
        nonlocal done
        for command in todo:
            sent = clock()
            if sent >= end:
                break
            await r.execute_command(*command)  # type: ignore[no-untyped-call]
            latencies.append(clock() - sent)
            done += 1

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    wall, cpu = time.perf_counter() - start, cpu_s() - c0
    await r.aclose()
    return _latency_figures(done, wall, cpu, latencies)


# -- the listener child -----------------------------------------------------------------

_sink: dict[str, Any] = {}


def push(seq: int, due_ms: int, payload: str) -> None:
    start_ms = time.time() * 1000
    client = _sink.get("sync")
    if client is None:
        client = _sink["sync"] = redis.Redis.from_url(os.environ[SINK_ENV])
    client.rpush(SINK_LIST, f"{seq},{due_ms},{start_ms:.3f}")


async def apush(seq: int, due_ms: int, payload: str) -> None:
    start_ms = time.time() * 1000
    client = _sink.get("async")
    if client is None:
        import redis.asyncio

        client = _sink["async"] = redis.asyncio.Redis.from_url(os.environ[SINK_ENV])
    await client.rpush(SINK_LIST, f"{seq},{due_ms},{start_ms:.3f}")


def noop(*args: Any, **kwargs: Any) -> None:
    pass


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def _listen(url: str, ready: Path, max_seconds: float) -> None:
    from timers import Listener

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options: dict[str, Any] = {}
    if os.environ.get(HISTORY_ENV) == "off":  # (only given to a tree that has the option)
        from timers.listener.endings.history import OFF

        options["history"] = OFF
    if os.environ.get(CONCURRENCY_ENV):  # (only given to a tree that has the option)
        options["concurrency"] = int(os.environ[CONCURRENCY_ENV])
    listener = Listener(url, prefix=PREFIX, registry={"push": push, "apush": apush,
                                                      "noop": noop},
                        shutdown_timeout=5.0, **options)

    async def mark_ready() -> None:
        await listener.subscribed.wait()
        tune = _collector_tune()  # as `timers listen` does once the app is imported
        if tune is not None:  # (trees that do)
            tune()
        _write(ready, str(os.getpid()))

    async def watchdog() -> None:
        parent, end = os.getppid(), time.monotonic() + max_seconds
        while not stop.is_set():
            await asyncio.sleep(0.5)
            if os.getppid() != parent or time.monotonic() >= end:
                stop.set()

    helpers = [asyncio.create_task(mark_ready()), asyncio.create_task(watchdog())]
    try:
        await listener.run(stop)
    finally:
        for h in helpers:
            h.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        client = _sink.pop("async", None)
        if client is not None:
            await client.aclose()


def _collector_tune() -> Any:
    """The tree's ``tune`` of the garbage collector, or None in a tree without one."""
    return _tree_function(("timers.listener.tuning.collector", "timers.listener.collector"),
                          "tune")


def _tree_function(modules: tuple[str, ...], name: str) -> Any:
    """Function ``name`` of the first of ``modules`` the tree has (the listener's modules
    moved into folders on 2026-11-30: an earlier commit has the second), or None."""
    import importlib

    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


def run_listener(main: Any) -> None:
    """Run the listener on the event loop ``timers listen`` picks by default (uvloop when
    installed, ``$TIMERS_LOOP`` to choose), or on asyncio's in a tree without the choice."""
    run = _tree_function(("timers.listener.tuning.event_loop", "timers.listener.event_loop"),
                         "run")
    if run is None:
        asyncio.run(main)
    else:
        run(main)


def stop_child(child: subprocess.Popen[Any]) -> None:
    """Stop a listener process: SIGTERM (it drains), SIGKILL after 20 s."""
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def fire(url: str, sink_url: str, task: str, n: int, timeout: float) -> dict[str, float]:
    from timers import Timers, TimerSpec

    sink = redis.Redis.from_url(sink_url, decode_responses=True)
    sink.delete(SINK_LIST)
    r = redis.Redis.from_url(url)
    with tempfile.TemporaryDirectory(prefix="timers-side-") as tmp:
        env = dict(os.environ, **{SINK_ENV: sink_url})
        listeners = int(os.environ.get(LISTENERS_ENV, "1"))
        if task == "apush":
            env.setdefault(CONCURRENCY_ENV, str(ASYNC_CONCURRENCY // listeners))
        readies = [Path(tmp) / f"ready{i}" for i in range(listeners)]
        children = [subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__), "listen", "--url", url,
             "--ready", str(ready), "--seconds", str(timeout + 60)], env=env)
            for ready in readies]
        try:
            deadline = time.monotonic() + 30
            while not all(ready.exists() for ready in readies):
                if (any(c.poll() is not None for c in children)
                        or time.monotonic() > deadline):
                    raise SystemExit("the listener did not get ready")
                time.sleep(0.02)
            sec, usec = r.time()
            lead = 2 + n / 4_000  # room for schedule_many on a busy machine
            due_ms = round(sec * 1000 + usec / 1000 + lead * 1000)
            due = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
            with Timers(url, prefix=PREFIX) as t:
                t.schedule_many([TimerSpec(task, [i, due_ms, PAYLOAD], at=due)
                                 for i in range(n)])
            sec, usec = r.time()
            late_enqueue = max(0.0, sec * 1000 + usec / 1000 - due_ms)
            server_cpu0 = _server_cpu(r)
            cpu0 = sum(proc_cpu_s(c.pid) for c in children)
            end = time.monotonic() + lead + timeout
            while sink.llen(SINK_LIST) < n and time.monotonic() < end:
                time.sleep(0.05)
            cpu = sum(proc_cpu_s(c.pid) for c in children) - cpu0
            server_cpu = _server_cpu(r) - server_cpu0
        finally:
            for child in children:
                stop_child(child)
    starts = [float(line.split(",")[2]) for line in sink.lrange(SINK_LIST, 0, -1)]
    sink.close()
    r.close()
    return {**fire_figures(starts, due_ms, n, cpu, server_cpu),
            "late_enqueue_ms": late_enqueue}


def alone(sink_url: str, task: str, n: int) -> dict[str, float]:
    """The floor under ``fire``: ``push`` by 32 threads or ``apush`` by 50 coroutines, ``n``
    calls in all to ``sink_url``, the client made before the clock starts (the coroutines'
    50 connections too; the threads' pool connects as they first call, as a listener's
    does): {rate, n, worker_cpu_us} (this process's CPU per call, as a listener's is
    taken)."""
    os.environ[SINK_ENV] = sink_url
    if task == "push":
        import threading

        width = 32
        per = n // width
        push(0, 0, PAYLOAD)

        def calls() -> None:
            for i in range(per):
                push(i, 0, PAYLOAD)

        threads = [threading.Thread(target=calls) for _ in range(width)]
        c0, start = cpu_s(), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
        return {"rate": per * width / wall, "n": per * width,
                "worker_cpu_us": cpu / (per * width) * 1e6}

    async def coroutines() -> dict[str, float]:
        width = ASYNC_CONCURRENCY
        per = n // width
        await asyncio.gather(*(apush(0, 0, PAYLOAD) for _ in range(width)))

        async def calls() -> None:
            for i in range(per):
                await apush(i, 0, PAYLOAD)

        c0, start = cpu_s(), time.perf_counter()
        await asyncio.gather(*(calls() for _ in range(width)))
        wall, cpu = time.perf_counter() - start, cpu_s() - c0
        client = _sink.pop("async", None)
        if client is not None:
            await client.aclose()
        return {"rate": per * width / wall, "n": per * width,
                "worker_cpu_us": cpu / (per * width) * 1e6}

    result: dict[str, float] = {}

    async def main() -> None:
        result.update(await coroutines())

    run_listener(main())
    return result


def _server_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def fire_figures(starts: list[float], due_ms: int, n: int, listener_cpu: float,
                 server_cpu: float) -> dict[str, float]:
    """Fires/s and first start from the starts the tasks wrote (ms since the epoch)."""
    if not starts:
        return {"rate": 0.0, "n": 0, "complete": 0.0}
    span = (max(starts) - due_ms) / 1000
    return {"rate": len(starts) / span if span > 0 else float("inf"), "n": len(starts),
            "complete": float(len(starts) >= n), "first_ms": min(starts) - due_ms,
            "last_s": span, "worker_cpu_us": listener_cpu / len(starts) * 1e6,
            "server_cpu_us": server_cpu / len(starts) * 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="side.py")
    parser.add_argument("scenario", choices=["single", "bulk", "async", "bare", "fire",
                                             "listen", "alone"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--sink")
    parser.add_argument("--task", default="push", choices=["push", "apush"])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--batch", type=int, help="bulk: timers per schedule_many call")
    parser.add_argument("--aio", action="store_true", help="bulk: AsyncTimers")
    parser.add_argument("--ready", type=Path)
    opts = parser.parse_args(argv)
    if opts.scenario == "listen":
        run_listener(_listen(opts.url, opts.ready, opts.seconds))
        return
    if opts.scenario == "alone":
        out = alone(opts.sink, opts.task, opts.n)
    elif opts.scenario == "single":
        out = single(opts.url, opts.seconds, opts.n * 10)
    elif opts.scenario == "bulk" and opts.batch and opts.aio:
        out = asyncio.run(_abatches(opts.url, opts.n, opts.batch, opts.seconds))
    elif opts.scenario == "bulk" and opts.batch:
        out = batches(opts.url, opts.n, opts.batch, opts.seconds)
    elif opts.scenario == "bulk":
        out = bulk(opts.url, opts.n)
    elif opts.scenario == "async":
        out = asyncio.run(_async(opts.url, opts.seconds, opts.in_flight, opts.n * 100))
    elif opts.scenario == "bare" and opts.in_flight == 0:
        out = bare_single(opts.url, opts.seconds, min(opts.n * 5, 100_000))
    elif opts.scenario == "bare":
        out = asyncio.run(_bare(opts.url, opts.seconds, opts.in_flight,
                                min(opts.n * 2, 40_000)))
    else:
        out = fire(opts.url, opts.sink, opts.task, opts.n, timeout=10 + opts.n / 500)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
