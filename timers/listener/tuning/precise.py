"""Sub-millisecond waits for asyncio.

asyncio sleeps in ``epoll_wait``, whose timeout is whole milliseconds, rounded up: a wake
lands up to a millisecond late. A timer that must start *on* its due time waits its last
few milliseconds here instead: one daemon thread sleeps on a condition variable (which has
microsecond resolution) until the earliest deadline and wakes the event loop through
``call_soon_threadsafe``. Its wakes land far closer to the deadline than those of
``asyncio.sleep`` (figures: bench/FINDINGS.md, "Sub-millisecond waits").
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time

COARSE_MARGIN = 0.005
"""Seconds before a deadline at which the wait moves from asyncio to the timer thread."""


class PreciseSleeper:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._counter = itertools.count()
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def sleep_until(self, deadline: float) -> None:
        """Return at ``deadline`` on the ``time.monotonic`` clock, or just after it."""
        remaining = deadline - time.monotonic()
        if remaining > COARSE_MARGIN:
            await asyncio.sleep(remaining - COARSE_MARGIN)
            remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._condition:
            if self._closed:
                return
            heapq.heappush(self._heap, (deadline, next(self._counter), loop, future))
            self._condition.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="timers-precise", daemon=True
                )
                self._thread.start()
        await future

    def _run(self) -> None:
        with self._condition:
            while not self._closed:
                if not self._heap:
                    self._condition.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._condition.wait(wait)
                    continue
                _, _, loop, future = heapq.heappop(self._heap)
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_resolve, future)

    def close(self) -> None:
        with self._condition:
            self._closed = True
            pending = list(self._heap)
            self._heap.clear()
            self._condition.notify()
        for _, _, loop, future in pending:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
