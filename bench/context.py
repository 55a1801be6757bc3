"""The context every scenario gets: the server, the sizes, the results, the children."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.common import (
    BACKGROUND_TASK,
    HOUR,
    LOAD_CHUNK,
    PREFIX,
    Deadline,
    Results,
    Sizes,
    args_100,
    wait_until,
)
from bench.procs import ListenerProc
from bench.server_stats import CommandMonitor, MachineSample, config_value
from timers import Timers, TimerSpec

# -- the context every scenario gets ----------------------------------------------------


class Context:
    """The server connection, the sizes, the result table and the children to clean up."""

    def __init__(
        self, url: str, sizes: Sizes, concurrency: int, workdir: Path, results: Results,
    ) -> None:
        self.url = url
        self.sizes = sizes
        self.concurrency = concurrency
        self.workdir = workdir
        self.results = results
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self._children: list[ListenerProc] = []
        self._names = 0
        self._mark: MachineSample | None = None
        self.figures: dict[str, float] = {}
        """Figures one scenario measures and a later one compares with."""
        results.load_probe = self._others_since_mark

    def mark(self) -> None:
        """A measurement starts: rows added from now on show the CPU other processes used."""
        self._mark = MachineSample.take(self.r)

    def _others_since_mark(self) -> str:
        if self._mark is None:
            return ""
        others, _ = MachineSample.take(self.r).others_since(self._mark)
        return f"{others:.0f}%"

    # server state

    def fresh_db(self, *, aof: bool = True) -> None:
        """No listeners, an empty database, counters reset, AOF on or off (and settled)."""
        self.stop_listeners()
        self.r.flushall()
        self.set_aof(aof)
        self.r.config_resetstat()
        self.mark()

    def set_aof(self, on: bool) -> None:
        if config_value(self.r, "appendonly") != ("yes" if on else "no"):
            self.r.config_set("appendonly", "yes" if on else "no")
        self.wait_aof_settled()

    def wait_aof_settled(self, seconds: float = 180.0) -> None:
        """Wait for any AOF rewrite (a fork writing the whole dataset) to end."""

        def settled() -> bool:
            info = self.r.info("persistence")
            return not int(info.get("aof_rewrite_in_progress", 0)) and not int(
                info.get("aof_rewrite_scheduled", 0))

        if not wait_until(settled, seconds, 0.2):
            self.results.note(f"an AOF rewrite was still running after {seconds:.0f} s")

    def monitor(self) -> CommandMonitor:
        kwargs = self.r.connection_pool.connection_kwargs
        return CommandMonitor(str(kwargs.get("host", "127.0.0.1")), int(kwargs.get("port", 6379)))

    def redis_now_ms(self) -> float:
        sec, usec = self.r.time()
        return sec * 1000 + usec / 1000

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def wait_pending_below(self, n: int, seconds: float) -> bool:
        return wait_until(lambda: int(self.r.zcard(f"{PREFIX}|due")) <= n, seconds, 0.1)

    def fired_counter(self) -> int:
        return int(self.r.hget(f"{PREFIX}|stats", "fired") or 0)

    # producers

    def timers(self) -> Timers:
        return Timers(self.url, prefix=PREFIX)

    def bulk_load(
        self, n: int, *, task: str = BACKGROUND_TASK, in_: float = HOUR,
        args: Callable[[int], Any] = args_100, deadline: Deadline | None = None,
    ) -> tuple[int, float]:
        """Schedule ``n`` timers with ``schedule_many`` in chunks; (scheduled, seconds)."""
        done = 0
        started = time.perf_counter()
        with self.timers() as t:
            while done < n and not (deadline and deadline.passed()):
                size = min(LOAD_CHUNK, n - done)
                t.schedule_many([TimerSpec(task, args(done + i), in_=in_) for i in range(size)])
                done += size
        return done, time.perf_counter() - started

    # listeners

    def listener(self, *, expect: int = 0, max_seconds: float = 600.0,
                 metrics: bool = False) -> ListenerProc:
        """Start a listener child and wait until it is subscribed."""
        self._names += 1
        proc = ListenerProc(
            self.url, self.workdir, f"listener-{self._names}", concurrency=self.concurrency,
            expect=expect, max_seconds=max_seconds, metrics=metrics,
        )
        self._children.append(proc)
        proc.wait_ready()
        return proc

    def stop_listeners(self) -> None:
        for proc in self._children:
            with contextlib.suppress(Exception):
                proc.stop(grace=5.0)
        self._children.clear()

    def close(self) -> None:
        self.stop_listeners()
        with contextlib.suppress(Exception):
            self.r.close()
