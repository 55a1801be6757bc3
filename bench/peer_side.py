"""Huey and Celery, driven as their READMEs say, on the workload of ``bench/side.py``.

``python -P bench/peer_side.py PEER SCENARIO --url URL …`` with the python of the peers'
own venv (:mod:`bench.peers` makes it under /tmp; the project never depends on them).
Prints one JSON object of figures on its last line of stdout, as ``side.py`` does.

- ``single``: Huey ``task.schedule(kwargs=…, delay=3600)`` (one LPUSH of a pickled message)
  or Celery ``task.apply_async(kwargs=…, countdown=3600)``, one after another for
  ``--seconds``; 100-byte args.
- ``fire``: ``--n`` tasks due at one instant (``eta``), one worker process (a child of this
  one: Huey's consumer with 32 worker threads, Celery's worker with the threads pool,
  concurrency 32, as timers' listener runs 32 at a time); the task RPUSHes
  ``seq,due_ms,start_ms`` to the second server ``--sink``. The due time leaves room for
  the peer to take in all N before it (its producer is slower than ``schedule_many``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import redis

HOUR = 3600
SINK_LIST = "bench:pushed"
SINK_ENV = "BENCH_SINK_URL"
URL_ENV = "BENCH_BROKER_URL"
PAYLOAD = "p" * 100
ARGS = {"user_id": 1, "text": "x" * 87}
WORKERS = 32
_sink: dict[str, Any] = {}


def _push(seq: int, due_ms: int, payload: str) -> None:
    start_ms = time.time() * 1000
    client = _sink.get("sync")
    if client is None:
        client = _sink["sync"] = redis.Redis.from_url(os.environ[SINK_ENV])
    client.rpush(SINK_LIST, f"{seq},{due_ms},{start_ms:.3f}")


def _noop(**kwargs: Any) -> None:
    pass


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the peers, set up the same way in the producer and the worker ---------------------


def huey_app(url: str) -> tuple[Any, Any, Any]:
    from huey import RedisHuey

    huey = RedisHuey("bench-huey", url=url)
    return huey, huey.task(name="push")(_push), huey.task(name="noop")(_noop)


def celery_app(url: str) -> tuple[Any, Any, Any]:
    from celery import Celery

    app = Celery("bench", broker=url)
    app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False,
                    broker_connection_retry_on_startup=True)
    return app, app.task(name="push")(_push), app.task(name="noop")(_noop)


APPS = {"huey": huey_app, "celery": celery_app}


def enqueue_single(peer: str, url: str, seconds: float, max_n: int) -> dict[str, float]:
    _, _, noop = APPS[peer](url)
    if peer == "huey":
        def call() -> None:
            noop.schedule(kwargs=ARGS, delay=HOUR)
    else:
        def call() -> None:
            noop.apply_async(kwargs=ARGS, countdown=HOUR)
    for _ in range(50):
        call()
    n, c0, start = 0, cpu_s(), time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end and n < max_n:
        for _ in range(50):
            call()
        n += 50
    wall, cpu = time.perf_counter() - start, cpu_s() - c0
    return {"rate": n / wall, "n": n, "client_cpu_us": cpu / n * 1e6}


def _enqueue_rate(peer: str, noop: Any, n: int = 200) -> float:
    """Calls/s of this peer's producer here and now (``n`` no-op tasks an hour out)."""
    start = time.perf_counter()
    for _ in range(n):
        if peer == "huey":
            noop.schedule(kwargs=ARGS, delay=HOUR)
        else:
            noop.apply_async(kwargs=ARGS, countdown=HOUR)
    return n / (time.perf_counter() - start)


def work(peer: str, url: str) -> None:
    """The worker process: one Huey consumer or one Celery worker, 32 threads."""
    app, _, _ = APPS[peer](url)
    if peer == "huey":
        app.create_consumer(workers=WORKERS, worker_type="thread").run()
    else:
        app.worker_main(["worker", "--pool=threads", f"--concurrency={WORKERS}",
                         "--loglevel=WARNING", "--without-gossip", "--without-mingle",
                         "--without-heartbeat"])


def fire(peer: str, url: str, sink_url: str, n: int, timeout: float) -> dict[str, float]:
    _, push, noop = APPS[peer](url)
    sink = redis.Redis.from_url(sink_url, decode_responses=True)
    sink.delete(SINK_LIST)
    r = redis.Redis.from_url(url)
    env = dict(os.environ, **{SINK_ENV: sink_url})
    child = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), peer, "work",
                              "--url", url], env=env)
    try:
        time.sleep(2.0)  # the worker imports and connects meanwhile
        if child.poll() is not None:
            raise SystemExit(f"the {peer} worker exited")
        rate = _enqueue_rate(peer, noop)
        sec, usec = r.time()
        lead = 2 + 1.5 * n / rate  # room to enqueue all N before the due time
        due_ms = round(sec * 1000 + usec / 1000 + lead * 1000)
        due = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
        for i in range(n):
            if peer == "huey":
                push.schedule(args=(i, due_ms, PAYLOAD), eta=due)
            else:
                push.apply_async(args=(i, due_ms, PAYLOAD), eta=due)
        now = time.time() * 1000
        late_enqueue = max(0.0, now - due_ms)
        info = r.info("cpu")
        server0 = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        cpu0 = proc_cpu_s(child.pid)
        end = time.monotonic() + max(0.0, (due_ms - now) / 1000) + timeout
        while sink.llen(SINK_LIST) < n and time.monotonic() < end:
            time.sleep(0.05)
        cpu = proc_cpu_s(child.pid) - cpu0
        info = r.info("cpu")
        server = float(info["used_cpu_sys"]) + float(info["used_cpu_user"]) - server0
    finally:
        child.send_signal(signal.SIGTERM if peer == "celery" else signal.SIGINT)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    starts = [float(line.split(",")[2]) for line in sink.lrange(SINK_LIST, 0, -1)]
    sink.close()
    r.close()
    if not starts:
        return {"rate": 0.0, "n": 0, "complete": 0.0}
    span = (max(starts) - due_ms) / 1000
    return {"rate": len(starts) / span if span > 0 else float("inf"), "n": len(starts),
            "complete": float(len(starts) >= n), "first_ms": min(starts) - due_ms,
            "last_s": span, "worker_cpu_us": cpu / len(starts) * 1e6,
            "server_cpu_us": server / len(starts) * 1e6, "late_enqueue_ms": late_enqueue}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="peer_side.py")
    parser.add_argument("peer", choices=sorted(APPS))
    parser.add_argument("scenario", choices=["single", "fire", "work"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--sink")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    opts = parser.parse_args(argv)
    if opts.scenario == "work":
        work(opts.peer, opts.url)
        return
    if opts.scenario == "single":
        out = enqueue_single(opts.peer, opts.url, opts.seconds, opts.n * 10)
    else:
        out = fire(opts.peer, opts.url, opts.sink, opts.n, timeout=10 + opts.n / 300)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
