"""The listener's own CPU per ``async def`` fire, in one process, old and new alternating:
``python -m bench.own_cpu [--tree NAME=PATH …] [--task anoop,apush] [--n N] [--rounds R]
[--profile DIR]``.

What ``bench.compare``'s ``fire_async`` measures, with less noise in it: ``--n`` timers due at
one instant (``schedule_many`` by a producer process, the listener already subscribed), one
listener process (50 runs at once, as ``fire_async``), its task one of:

- ``anoop``: an ``async def`` that returns at once: what the listener spends of its own;
- ``ayield``: an ``async def`` that awaits ``asyncio.sleep(0)`` once (a run that waits);
- ``apush``: ``fire_async``'s task (an RPUSH to a second server with redis-py asyncio).

The listener process takes its own CPU (``time.process_time``: every thread) from the moment
its producer has scheduled the timers (a signal, before the due time) to its ``--n``-th task
call plus 0.3 s (its endings are written by then), and with ``--profile DIR`` a cProfile of
its event loop's thread over the same span (``DIR/<tree>-<task>-<round>.prof``; read with
``pstats``, ``--top`` lines sorted by tottime printed for the last round).

A tree named ``floor`` (``--tree floor=PATH``, PATH a checkout of this code) runs no
:class:`~timers.Listener` but the floor under one (:func:`_floor_listen`): the same claim and
finish scripts of that tree, sent by a plain ``redis.asyncio`` client with no Python of the
listener's between them: claim as many as there are free slots, read each run's task and
args, call the task in one of 50 worker coroutines, and write the endings ``ok`` in one
finish call per batch, with no history, journal, lease keeping, checks, flow or context. What
any listener built on these scripts spends at least, to set the listener's own figure
against.

Each tree is a folder holding a ``timers`` package (a checkout, or ``git archive`` of a
commit); its side runs with ``PYTHONPATH`` set to it and ``-P``, so that tree's code is the
one imported, producer and listener both. The trees take turns, round by round, the order
turning each round. Prints, per tree and task, the median and spread (min-max) of the CPU us
per fire, and the load average at each run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "bench"
PAYLOAD = "p" * 100
SINK_ENV = "BENCH_SINK_URL"
SINK_LIST = "bench:pushed"
CONCURRENCY = 50
CALLGRIND_ENV = "OWN_CPU_CALLGRIND"
"""A folder: the listener runs under callgrind, and its instructions per fire are counted
over the same span (deterministic where CPU time swings with the machine's load)."""
SETTLE_S = 0.3
"""After the last task call: the last endings are written within this."""
ARM_AHEAD_S = 0.05
"""The clock starts this long before the due time (the listener idles till then)."""
HERE = Path(__file__).resolve()
REPO = HERE.parent.parent

_state: dict[str, Any] = {"count": 0, "n": 0, "done": None, "sink": None}


def _called() -> None:
    _state["count"] += 1
    if _state["count"] == _state["n"] and _state["done"] is not None:
        _state["done"].set()


async def anoop(seq: int, due_ms: int, payload: str) -> None:
    _called()


async def ayield(seq: int, due_ms: int, payload: str) -> None:
    await asyncio.sleep(0)
    _called()


async def apush(seq: int, due_ms: int, payload: str) -> None:
    start_ms = time.time() * 1000
    client = _state["sink"]
    if client is None:
        import redis.asyncio

        client = _state["sink"] = redis.asyncio.Redis.from_url(os.environ[SINK_ENV])
    await client.rpush(SINK_LIST, f"{seq},{due_ms},{start_ms:.3f}")
    _called()


TASKS = {"anoop": anoop, "ayield": ayield, "apush": apush}


# -- the listener process -----------------------------------------------------------------


async def _listen(url: str, n: int, ready: Path, out: Path, profile: Path | None) -> None:
    from timers import Listener

    _state["n"], _state["done"] = n, asyncio.Event()
    stop, armed = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, armed.set)
    listener = Listener(url, prefix=PREFIX, registry=dict(TASKS), shutdown_timeout=5.0,
                        concurrency=CONCURRENCY)

    async def measure() -> None:
        await listener.subscribed.wait()
        tune = _collector_tune()  # as `timers listen` does once the app is imported
        if tune is not None:  # (trees that have it)
            tune()
        if _state["sink"] is None and os.environ.get(SINK_ENV):  # connect outside the clock
            await apush(-1, 0, PAYLOAD)
            _state["count"] = 0
        _write(ready, str(os.getpid()))
        await armed.wait()
        grind = os.environ.get(CALLGRIND_ENV)
        if grind:
            _callgrind_control("-z")
        profiler = cProfile.Profile() if profile is not None else None
        gc0 = [st["collections"] for st in gc.get_stats()]
        cpu0, wall0, t0 = time.process_time(), time.perf_counter(), os.times()
        if profiler is not None:
            profiler.enable()
        await _state["done"].wait()
        await asyncio.sleep(SETTLE_S)
        if profiler is not None:
            profiler.disable()
        instructions = _callgrind_control("-d", grind) if grind else 0
        cpu, wall, t1 = time.process_time() - cpu0, time.perf_counter() - wall0, os.times()
        if profiler is not None and profile is not None:
            profiler.dump_stats(str(profile))
        collections = [st["collections"] - g
                       for st, g in zip(gc.get_stats(), gc0, strict=True)]
        _write(out, json.dumps({"n": _state["count"], "cpu_s": cpu, "wall_s": wall,
                                "sys_s": t1.system - t0.system, "ir": instructions,
                                "gc": collections}))
        stop.set()

    helper = asyncio.create_task(measure())
    try:
        await asyncio.wait_for(listener.run(stop), 300)
    finally:
        helper.cancel()
        await asyncio.gather(helper, return_exceptions=True)
        client = _state["sink"]
        if client is not None:
            await client.aclose()


async def _floor_listen(url: str, n: int, ready: Path, out: Path) -> None:
    """The floor under a listener (see the module's text): claims, calls and endings only."""
    import redis.asyncio

    from timers.model.encoding import Record
    from timers.model.keys import Keyspace
    from timers.model.runs import Run
    from timers.store.scripts import Scripts

    _state["n"], _state["done"] = n, asyncio.Event()
    stop, armed = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, armed.set)
    client = redis.asyncio.Redis.from_url(url)
    scripts = Scripts(client, Keyspace(PREFIX))
    queue: asyncio.Queue[tuple[str, Any, list[Any]]] = asyncio.Queue()
    endings: list[tuple[str, str, str, str]] = []
    free = asyncio.Semaphore(CONCURRENCY)
    wrote = asyncio.Event()

    async def worker() -> None:
        while True:
            token, fn, args = await queue.get()
            await fn(*args)
            endings.append((token, "ok", "", ""))
            free.release()
            wrote.set()

    async def finisher() -> None:
        while True:
            await wrote.wait()
            wrote.clear()
            batch = endings[:]
            del endings[:]
            if batch:
                await scripts.finish(retention_ms=60_000, endings=batch)

    async def claimer() -> None:
        while not stop.is_set():
            taken = 0
            while taken == 0 or not free.locked():  # as many as there are free slots
                await free.acquire()
                taken += 1
            reply = await scripts.claim(limit=taken, lease_ms=30_000, horizon_ms=0,
                                        listener_id="floor")
            items = reply[3:]
            for i in range(0, len(items), 3):
                run = Run.parse(items[i], items[i + 1], items[i + 2])
                record = Record.decode(run.record_text)
                fn = TASKS[record.task.rpartition(".")[2]]
                queue.put_nowait((run.token, fn, list(record.args or [])))
            for _ in range(taken - len(items) // 3):
                free.release()
            if not items:
                await asyncio.sleep(0.001)

    if _state["sink"] is None and os.environ.get(SINK_ENV):
        await apush(-1, 0, PAYLOAD)
        _state["count"] = 0
    tune = _collector_tune()
    if tune is not None:
        tune()
    _write(ready, str(os.getpid()))
    await armed.wait()
    loops = [asyncio.create_task(worker()) for _ in range(CONCURRENCY)]
    loops += [asyncio.create_task(finisher()), asyncio.create_task(claimer())]
    grind = os.environ.get(CALLGRIND_ENV)
    if grind:
        _callgrind_control("-z")
    cpu0, wall0, t0 = time.process_time(), time.perf_counter(), os.times()
    await _state["done"].wait()
    await asyncio.sleep(SETTLE_S)
    instructions = _callgrind_control("-d", grind) if grind else 0
    cpu, wall, t1 = time.process_time() - cpu0, time.perf_counter() - wall0, os.times()
    _write(out, json.dumps({"n": _state["count"], "cpu_s": cpu, "wall_s": wall,
                            "sys_s": t1.system - t0.system, "ir": instructions, "gc": []}))
    stop.set()
    for task in loops:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    await client.aclose()
    if _state["sink"] is not None:
        await _state["sink"].aclose()


def _side_script() -> Any:
    """``bench/side.py``, loaded from its path: both run as scripts in a tree's interpreter
    (so neither imports the ``bench`` package, which would be that tree's), and it knows
    where a tree keeps the listener's GC tuning and event loop."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_side_script", HERE.parent / "side.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _collector_tune() -> Any:
    """The tree's ``tune`` of the garbage collector, or None in a tree without one."""
    return _side_script()._collector_tune()


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _callgrind_control(option: str, folder: str = "") -> int:
    """Zero (``-z``) or dump (``-d``) this process's callgrind counters; for a dump, the
    instructions counted since the zeroing."""
    before = set(Path(folder).glob(f"*.{os.getpid()}.*")) if folder else set()
    subprocess.run(["callgrind_control", option, str(os.getpid())], check=True,
                   capture_output=True, timeout=120)
    if not folder:
        return 0
    for path in sorted(set(Path(folder).glob(f"*.{os.getpid()}.*")) - before):
        for line in path.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return 0


def _run_loop(main: Any) -> None:
    _side_script().run_listener(main)


# -- the producer (one per run, in the tree's interpreter) ----------------------------------


def side(url: str, task: str, n: int, profile: Path | None,
         floor: bool = False) -> dict[str, Any]:
    import redis

    from timers import Timers, TimerSpec

    r = redis.Redis.from_url(url)
    r.flushdb()
    with tempfile.TemporaryDirectory(prefix="timers-own-") as tmp:
        ready, out = Path(tmp) / "ready", Path(tmp) / "out"
        args = [sys.executable, "-P", str(HERE), "listen", "--url", url, "--n", str(n),
                "--ready", str(ready), "--out", str(out)]
        if profile is not None:
            args += ["--profile", str(profile)]
        if floor:
            args.append("--floor")
        grind = os.environ.get(CALLGRIND_ENV)
        if grind:
            args = ["valgrind", "--tool=callgrind", "--quiet",
                    f"--callgrind-out-file={grind}/cg.%p.out", *args]
        child = subprocess.Popen(args)
        try:
            deadline = time.monotonic() + (600 if grind else 30)
            while not ready.exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the listener did not get ready")
                time.sleep(0.02)
            sec, usec = r.time()
            due_ms = round(sec * 1000 + usec / 1000 + (1.0 + n / 10_000) * 1000)
            from datetime import UTC, datetime

            due = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
            with Timers(url, prefix=PREFIX) as t:
                t.schedule_many([TimerSpec(task, [i, due_ms, PAYLOAD], at=due)
                                 for i in range(n)])
            sec, usec = r.time()
            margin_ms = due_ms - (sec * 1000 + usec / 1000)
            time.sleep(max(0.0, margin_ms / 1000 - ARM_AHEAD_S))  # the idle wait left out
            child.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 60 + n / (10 if grind else 500)
            while not out.exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the listener did not finish")
                time.sleep(0.05)
            time.sleep(0.05)
            got = json.loads(out.read_text())
        finally:
            _side_script().stop_child(child)
    r.close()
    per = 1e6 / max(got["n"], 1)
    return {**got, "margin_ms": margin_ms, "cpu_us": got["cpu_s"] * per,
            "sys_us": got["sys_s"] * per, "ir_k": got["ir"] / max(got["n"], 1) / 1000}


# -- the driver -------------------------------------------------------------------------


def _servers() -> Any:
    sys.path.insert(0, str(REPO))
    from timers.dev.server import EmbeddedServer

    return EmbeddedServer(config=REPO / "redis.conf"), EmbeddedServer()


def drive(trees: dict[str, Path], tasks: list[str], n: int, rounds: int,
          profile: Path | None, top: int) -> None:
    broker, sink = _servers()
    results: dict[tuple[str, str], list[float]] = {}
    metric, unit = (("ir_k", "k instr/fire") if os.environ.get(CALLGRIND_ENV)
                    else ("cpu_us", "us/fire"))
    loads: list[float] = []
    with broker, sink:
        names = list(trees)
        for rnd in range(rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for task in tasks:
                for name in order:
                    load = os.getloadavg()[0]
                    loads.append(load)
                    prof = (profile / f"{name}-{task}-{rnd}.prof") if profile else None
                    env = dict(os.environ, PYTHONPATH=str(trees[name]), **{SINK_ENV: sink.url})
                    proc = subprocess.run(
                        [sys.executable, "-P", str(HERE), "side", "--url", broker.url,
                         "--task", task, "--n", str(n)]
                        + (["--profile", str(prof)] if prof else [])
                        + (["--floor"] if name == "floor" else []),
                        env=env, capture_output=True, text=True, timeout=600)
                    if proc.returncode:
                        print(f"{name} {task} round {rnd}: failed\n{proc.stderr[-2000:]}")
                        continue
                    got = json.loads(proc.stdout.strip().splitlines()[-1])
                    results.setdefault((name, task), []).append(got[metric])
                    print(f"round {rnd} {task:6} {name:12} {got[metric]:7.1f} {unit} "
                          f"(sys {got['sys_us']:.1f} us; {got['n']} in {got['wall_s']:.2f} s,"
                          f" margin {got['margin_ms']:.0f} ms, load {load:.2f}, gc "
                          f"{got.get('gc')})", flush=True)
    print(f"\nload {min(loads):.2f}-{max(loads):.2f}; N={n}, {rounds} rounds")
    for task in tasks:
        base = None
        for name in trees:
            got = sorted(results.get((name, task), []))
            if not got:
                continue
            med = statistics.median(got)
            base = base or med
            print(f"{task:6} {name:12} median {med:7.1f} {unit} ({got[0]:.1f}-{got[-1]:.1f}), "
                  f"{med / base:.2f}x the first")
    if profile is not None and top:
        import pstats

        for name in trees:
            for task in tasks:
                path = profile / f"{name}-{task}-{rounds - 1}.prof"
                if path.exists():
                    print(f"\n== {name} {task}: top {top} by tottime ==")
                    pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.own_cpu")
    p.add_argument("mode", nargs="?", default="drive", choices=["drive", "side", "listen"])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                   help="a folder holding a timers package (default: this checkout)")
    p.add_argument("--task", default="anoop,apush")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", type=Path)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--url")
    p.add_argument("--ready", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--floor", action="store_true", help="(side, listen) the floor listener")
    opts = p.parse_args(argv)
    if opts.mode == "listen":
        _run_loop(_floor_listen(opts.url, opts.n, opts.ready, opts.out) if opts.floor
                  else _listen(opts.url, opts.n, opts.ready, opts.out, opts.profile))
    elif opts.mode == "side":
        print(json.dumps(side(opts.url, opts.task, opts.n, opts.profile, opts.floor)))
    else:
        trees = dict(t.split("=", 1) for t in opts.tree) or {"working": str(REPO)}
        if opts.profile:
            opts.profile.mkdir(parents=True, exist_ok=True)
        drive({k: Path(v).resolve() for k, v in trees.items()}, opts.task.split(","), opts.n,
              opts.rounds, opts.profile, opts.top)


if __name__ == "__main__":
    main()
