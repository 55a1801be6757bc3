"""Tasks that misbehave, for the hostile faults of :mod:`bench.faults`.

Both write the same ledger lines as ``ledger.mark`` (see :mod:`bench.fault_tasks.ledger`).
"""

from __future__ import annotations

import os
import time

from bench.fault_tasks.ledger import write_mark


def poison(tid: str, seconds: float = 0.0) -> None:
    """Record the start, then kill the listener process running it (as a segfault in a C
    extension would): no end line, ever. Runs under the default ``max_crashes``."""
    write_mark("S", tid)
    os._exit(1)


async def blocked(tid: str, seconds: float = 0.0) -> None:
    """An ``async def`` that blocks the event loop for ``seconds`` (a sync HTTP client
    called from a coroutine), then returns normally."""
    write_mark("S", tid)
    time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
    write_mark("E", tid)
