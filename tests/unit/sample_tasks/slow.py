"""A task that takes a while, like one that calls a web service."""

from __future__ import annotations

import asyncio

DONE: list[float] = []


async def work(seconds: float) -> None:
    await asyncio.sleep(seconds)  # the work itself, not a wait for an outcome
    DONE.append(seconds)
