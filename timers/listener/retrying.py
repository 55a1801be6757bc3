"""What the listener's loops do when Redis is away: which errors they outlive, how long
they wait before trying again, and logging each loss and recovery once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import redis

log = logging.getLogger("timers.listener")

RETRYABLE: tuple[type[BaseException], ...] = (redis.RedisError, ConnectionError, TimeoutError,
                                              OSError)
"""Errors a loop outlives by retrying with a delay: a lost connection, and also a server
that refuses for a while (OOM under noeviction, READONLY after a failover, LOADING).
redis-py's connection and timeout errors are :class:`redis.RedisError` too."""


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


class ConnectionState:
    """Logs each change of a connection's health once, not once per attempt."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.lost = False

    def failed(self, exc: BaseException) -> None:
        if not self.lost:
            self.lost = True
            log.warning("%s lost: %s; retrying", self.what, exc or type(exc).__name__)

    def ok(self) -> None:
        if self.lost:
            self.lost = False
            log.warning("%s back", self.what)


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
