"""What the listener's loops do when Redis is away: which errors they outlive, how long
they wait before trying again, and logging each loss and recovery once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import redis

log = logging.getLogger("timers.listener")

RETRYABLE: tuple[type[BaseException], ...] = (redis.RedisError, ConnectionError, TimeoutError,
                                              OSError, redis.exceptions.RedisClusterException)
"""Errors a loop outlives by retrying with a delay: a lost connection, and also a server
that refuses for a while (OOM under noeviction, READONLY after a failover, LOADING).
redis-py's connection and timeout errors are :class:`redis.RedisError` too; a cluster
client that reaches no node raises ``RedisClusterException``, which is not."""


class ReconnectDelays:
    """Delays between attempts to reach Redis again: 0.1 s doubling to 5 s.

    (Not :class:`timers.Backoff`, which spaces the retries of a failed task.)"""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap, self.current = first, cap, first

    def next(self) -> float:
        delay, self.current = self.current, min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.current = self.first


class Outage:
    """One listener's view of its connection to Redis, shared by its loops, so a server
    restart or a failover logs one line when the first loop loses it and one when the last
    gets it back (with the server's new address after a failover), not a pair per loop.
    Thread-safe: the lease thread reports too."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.down: set[str] = set()
        self.since = 0.0
        self.where: str | None = None
        self._where_before: str | None = None
        self._lock = threading.Lock()

    def failed(self, part: str, exc: BaseException) -> None:
        with self._lock:
            if self.down or part in self.down:
                self.down.add(part)
                return
            self.down.add(part)
            self.since, self._where_before = self.clock(), self.where
        log.warning("connection to Redis lost (%s): %s; retrying", part,
                    exc or type(exc).__name__)

    def ok(self, part: str, where: str | None = None) -> None:
        """``part`` works again; ``where``: the server address it reached, if it knows."""
        with self._lock:
            self.where = where or self.where
            if part not in self.down:
                return
            self.down.discard(part)
            if self.down:
                return
            before, now = self._where_before, self.where
            seconds = self.clock() - self.since
        moved = f"; the server is now {now} (was {before})" if before and now != before else ""
        log.warning("connection to Redis back after %.1f s%s", seconds, moved)


class ConnectionState:
    """One loop's connection health, reported to its listener's :class:`Outage`."""

    def __init__(self, what: str, outage: Outage | None = None) -> None:
        self.what = what
        self.outage = outage or Outage()

    def failed(self, exc: BaseException) -> None:
        self.outage.failed(self.what, exc)

    def ok(self, where: str | None = None) -> None:
        self.outage.ok(self.what, where)


async def pause(seconds: float, until: asyncio.Event) -> None:
    """Sleep, but return at once when ``until`` is set.

    Every loop checks its flag too: redis-py may swallow a task cancellation."""
    if seconds <= 0 or until.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await until.wait()


async def beat_until(stopping: asyncio.Event, beat: Callable[[], Awaitable[None]],
                     interval: float) -> None:
    """Call ``beat`` every ``interval`` seconds until ``stopping``; a lost connection
    skips a beat (the next one comes on time)."""
    while not stopping.is_set():
        with contextlib.suppress(*RETRYABLE):
            await beat()
        await pause(interval, stopping)
