"""What recurring test timers run: a quick task, a slow one, and one that waits to be let go."""

from __future__ import annotations

import asyncio
import json
import time

from tests.cron_tasks import RELEASE, RUNS, STARTED
from tests.task_pkg import client


def _record(tag: str, started: float) -> None:
    client().rpush(RUNS, json.dumps([tag, started, time.time()]))


def hit(tag: str) -> None:
    """Record a run."""
    _record(tag, time.time())


async def slow(tag: str, seconds: float) -> None:
    """Take ``seconds``, then record the run with its start and end."""
    started = time.time()
    await asyncio.sleep(seconds)  # the work itself, not a wait for an outcome
    _record(tag, started)


async def hold(tag: str, seconds: float = 30.0) -> None:
    """Note the start, wait until ``cron:release`` exists (at most ``seconds``), record."""
    started = time.time()
    client().rpush(STARTED, tag)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not client().exists(RELEASE):  # noqa: ASYNC110
        await asyncio.sleep(0.02)  # the release comes from another process: poll for it
    _record(tag, started)
