"""What the listener's loops do when Redis is away: which errors they outlive, how long
they wait before trying again, and logging each loss and recovery once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis

log = logging.getLogger("timers.listener")

T = TypeVar("T")

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


async def pause(seconds: float, until: asyncio.Event) -> None:
    """Sleep, but return at once when ``until`` is set.

    Every loop checks its flag too: redis-py may swallow a task cancellation."""
    if seconds <= 0 or until.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await until.wait()


class Retry:
    """One loop's way back to Redis: a failure is reported to the listener's
    :class:`Outage` (as ``what``), then waited out with ``delays`` (a wait ``until`` ends);
    a success is reported and the delays start over. ``told`` instead of ``what``: a line
    logged at the first failure only (``%s``: the error), for a check at start-up."""

    def __init__(self, until: asyncio.Event, what: str = "", outage: Outage | None = None,
                 *, told: str = "", delays: ReconnectDelays | None = None) -> None:
        self.until, self.what, self.told = until, what, told
        self.outage, self.delays = outage or Outage(), delays or ReconnectDelays()

    async def failed(self, exc: BaseException) -> None:
        """Report ``exc``, then wait the next delay."""
        if self.what:
            self.outage.failed(self.what, exc)
        elif self.told:
            log.warning(self.told, exc)
            self.told = ""
        await pause(self.delays.next(), self.until)

    def ok(self, where: str | None = None) -> None:
        """Report that Redis answered (``where``: the server's address, if known)."""
        if self.what:
            self.outage.ok(self.what, where)
        self.delays.reset()

    async def answer(self, step: Callable[[], Awaitable[T]]) -> T | None:
        """``step``'s result, tried again after each :data:`RETRYABLE` error; None once
        ``until`` is set. Other errors are raised."""
        while not self.until.is_set():
            try:
                result = await step()
            except RETRYABLE as exc:
                await self.failed(exc)
                continue
            self.ok()
            return result
        return None


async def beat_until(stopping: asyncio.Event, beat: Callable[[], Awaitable[None]],
                     interval: float) -> None:
    """Call ``beat`` every ``interval`` seconds until ``stopping``; a lost connection
    skips a beat (the next one comes on time)."""
    while not stopping.is_set():
        with contextlib.suppress(*RETRYABLE):
            await beat()
        await pause(interval, stopping)
