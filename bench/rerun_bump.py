"""Lateness of other timers while a dead listener's runs rerun in quarantine.

Two ``timers listen`` processes (lease 2 s) serve a steady 300 timers/s of a no-op probe,
each due 300 ms after it is scheduled; its task RPUSHes how late it started. Five seconds
in, 30 one-second timers come due and both listeners start them; half a second later one
listener is ``kill -9``ed. Its runs lapse two seconds on and the other listener reruns
them, each in a quarantine child process (:mod:`timers.listener.quarantine.parent`). Printed:
the listeners' CPU per timer at the steady rate (both processes, the 4 s before the slow
timers), probe lateness p50/p99/max before the kill and in the 3 s the reruns start in
(the probes the dead listener held, due before the kill and rerun a lease late, left out).

The tasks package imports a set of standard modules, as an app's does (the quarantine
fork server imports it once; before it did, each quarantine child imported it again).
Run one side per call; compare commits by running each alternately, with ``PYTHONPATH``
naming the code to measure (from a folder that holds no ``timers/``)::

    PYTHONPATH=. python -m bench.rerun_bump
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from timers import Timers

try:
    from timers.dev.server import EmbeddedServer
except ImportError:  # an older tree (PYTHONPATH naming it)
    from timers.server import EmbeddedServer  # type: ignore[no-redef]

RATE = 300
AHEAD_MS = 300
KILL_AT = 5.5
LEASE = 2.0
END_AT = 12.0

TASKS = {
    "__init__.py": "",
    "app.py": """
import multiprocessing, os, time
import argparse, decimal, email.mime.multipart, http.client, sqlite3, unittest, xml.dom.minidom
import redis
_sink = redis.Redis.from_url(os.environ["SINK_URL"])


def probe(due_ms):
    rerun = int(multiprocessing.parent_process() is not None)  # in quarantine: a rerun
    _sink.rpush("late", f"{time.time() * 1000:.1f} {time.time() * 1000 - due_ms:.2f} {rerun}")


def slow():
    time.sleep(1.0)
""",
}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce(timers: Timers, stop: threading.Event) -> None:
    """Schedule the probe at :data:`RATE` per second until ``stop``."""
    start, i = time.monotonic(), 0
    while not stop.is_set():
        wait = start + i / RATE - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        timers.schedule("app.probe", [time.time() * 1000 + AHEAD_MS], in_=AHEAD_MS / 1000)
        i += 1


def main() -> None:
    """One run; prints a JSON line of the figures."""
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer() as server:
        for name, text in TASKS.items():
            (Path(tmp) / "rerunapp" / name).parent.mkdir(exist_ok=True)
            (Path(tmp) / "rerunapp" / name).write_text(text)
        env = {**os.environ, "SINK_URL": server.url, "PYTHONPATH": os.pathsep.join(
            [os.environ.get("PYTHONPATH", ""), tmp])}
        command = [sys.executable, "-m", "timers", "listen", "--url", server.url,
                   "--lease", str(LEASE), "--tasks", "rerunapp"]
        listeners = [subprocess.Popen(command, cwd=tmp, env=env, stderr=subprocess.DEVNULL)
                     for _ in range(2)]
        client = redis.Redis.from_url(server.url)
        timers = Timers(client)
        time.sleep(4)  # the listeners start (imports, quarantine's fork server)
        stop = threading.Event()
        producer = threading.Thread(target=produce, args=(timers, stop))
        t0 = time.time() * 1000
        producer.start()
        time.sleep(1.0)
        cpu0, cpu0_ms = [_cpu_s(p.pid) for p in listeners], time.time() * 1000
        time.sleep(KILL_AT - 1.5)
        cpu1, cpu1_ms = [_cpu_s(p.pid) for p in listeners], time.time() * 1000
        for _ in range(30):
            timers.schedule("app.slow", [], in_=0)
        time.sleep(0.5)
        kill_ms = time.time() * 1000
        listeners[0].send_signal(signal.SIGKILL)
        time.sleep(END_AT - KILL_AT)
        stop.set()
        producer.join()
        time.sleep(1.5)
        for child in listeners[1:]:
            child.send_signal(signal.SIGTERM)
        for child in listeners:
            child.wait(30)
        rows = [tuple(map(float, raw.split())) for raw in client.lrange("late", 0, -1)]
        before = [late for at, late, _ in rows if t0 + 1000 <= at < kill_ms]
        # the probes the dead listener held (due before the kill) rerun late by its lease:
        # not what is measured (by due time, so a tree without quarantine is read alike)
        reruns = [late for at, late, rerun in rows if not rerun and at - late > kill_ms + 50
                  and kill_ms + LEASE * 1000 <= at < kill_ms + (LEASE + 3) * 1000]
        stats = timers.stats()
        steady = sum(1 for at, _, _ in rows if cpu0_ms <= at < cpu1_ms)
        cpu_us = (sum(cpu1) - sum(cpu0)) / max(steady, 1) * 1e6
        print(json.dumps({
            "cpu_us_per_timer": round(cpu_us, 1),
            "before_p50": statistics.median(before), "before_p99": percentile(before, 0.99),
            "before_max": max(before), "reruns_p50": statistics.median(reruns),
            "reruns_p99": percentile(reruns, 0.99), "reruns_max": max(reruns),
            "probes": len(rows), "fired": stats.fired, "pending": stats.pending}))


if __name__ == "__main__":
    main()
