"""The workload's task with nothing of timers around it: the floor a listener adds to.

The same ``sink.push`` (a plain function) run by bare threads, and ``sink.apush`` (``async
def``) by coroutines on one event loop, each calling it back to back: no claims, no
finishes, no pool hand-off. In one process the task's Python and timers' Python share one
GIL, so a listener's fires/s with this task cannot pass ``1 / (task CPU + listener CPU per
no-op fire)``; the notes give that ceiling next to the measured figure.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from bench.listener import apush, close_async_sink, push

PAYLOAD = "p" * 100


def threads(n: int, count: int) -> tuple[float, float]:
    """``push`` called ``n`` times by ``count`` threads: (calls/s, process CPU us per call)."""
    per = n // count

    def work() -> None:
        for i in range(per):
            push(i, 0, PAYLOAD)

    push(0, 0, PAYLOAD)  # connect outside the clock
    workers = [threading.Thread(target=work) for _ in range(count)]

    def run_all() -> None:
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return _timed(per * count, run_all)


def coroutines(n: int, count: int) -> tuple[float, float]:
    """``apush`` called ``n`` times by ``count`` coroutines on one loop: (calls/s, CPU us)."""
    per = n // count

    async def work() -> None:
        for i in range(per):
            await apush(i, 0, PAYLOAD)

    async def main() -> tuple[float, float]:
        await apush(0, 0, PAYLOAD)  # connect outside the clock
        wall0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(work() for _ in range(count)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        await close_async_sink()  # its client belongs to this loop
        return per * count / wall, cpu / (per * count) * 1e6

    return asyncio.run(main())


def _timed(n: int, body: Callable[[], object]) -> tuple[float, float]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    body()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return n / wall, cpu / n * 1e6
