"""An ``async def`` task that blocks the event loop, as a careless one does."""

from __future__ import annotations

import json
import time

from tests.task_pkg import RUNS, STARTED, client


async def block_loop(tag: str, seconds: float) -> None:
    """Record the start, ``time.sleep`` (not ``await asyncio.sleep``), record the run."""
    client().rpush(STARTED, tag)
    time.sleep(seconds)  # noqa: ASYNC251 - the point of this task
    client().rpush(RUNS, json.dumps([tag]))
