"""Keep the expiring keys of timers that have come within the near horizon.

Timers due further out than :data:`timers.model.wire.NEAR_HORIZON_MS` are pended without their
expiring key (it would only cost memory, and slow Redis's sampling of the keys that are
about to expire). Every listener calls ``near.lua`` every :data:`NEAR_INTERVAL` seconds,
which keys the timers that came within the horizon since. Nothing depends on it for
firing on time: the sweeper claims from the due index whether a timer has a key or not;
the keys are what lets the ``expired`` event name a timer too.
"""

from __future__ import annotations

import asyncio

from timers.listener.retrying import beat_until
from timers.model.wire import NEAR_INTERVAL
from timers.store.scripts import Scripts

BATCH = 50
"""Timers keyed per call at most: a backlog (a million timers loaded for one instant, or
listeners away for a day) is keyed in many short calls, not one long one."""
PAUSE = 0.002
"""Seconds between the calls of a backlog, so claims and finishes meet an idle server (a
backlog has an hour before its timers are due)."""


async def key_near_timers(scripts: Scripts, stopping: asyncio.Event) -> None:
    """Write the keys of timers that came within the horizon (all of them, in batches)."""
    for _ in range(10_000):
        reply = await scripts.near(BATCH)
        if int(reply[1]) or stopping.is_set():
            return
        await asyncio.sleep(PAUSE)  # let runs and claims go between batches


async def keep_near_keys(scripts: Scripts, stopping: asyncio.Event) -> None:
    """Every :data:`NEAR_INTERVAL` seconds until ``stopping`` (a lost connection or a full
    server skips a turn)."""
    await beat_until(stopping, lambda: key_near_timers(scripts, stopping), NEAR_INTERVAL)
