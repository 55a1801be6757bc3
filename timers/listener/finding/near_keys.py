"""Keep the expiring keys of timers that have come within the near horizon.

Timers due further out than :data:`timers.model.wire.NEAR_HORIZON_MS` are pended without their
expiring key (it would only cost memory, and slow Redis's sampling of the keys that are
about to expire). Every listener calls ``near.lua`` every :data:`NEAR_INTERVAL` seconds
(less often while there is nothing to key), which keys the timers that came within the
horizon since. Nothing depends on it for
firing on time: the sweeper claims from the due index whether a timer has a key or not;
the keys are what lets the ``expired`` event name a timer too.
"""

from __future__ import annotations

import asyncio
import contextlib

from timers.listener.retrying import RETRYABLE, pause
from timers.model.wire import NEAR_INTERVAL
from timers.store.scripts import Scripts

BATCH = 50
"""Timers keyed per call at most: a backlog (a million timers loaded for one instant, or
listeners away for a day) is keyed in many short calls, not one long one."""
NEAR_BACKOFF = 10
"""While turns find no timer to key (nothing pending comes within the horizon), the
turns slow down to one in this many :data:`NEAR_INTERVAL` (5 minutes): a timer then gets
its key between 55 and 60 minutes before its due time, and an idle listener sends its
heartbeats alone."""
PAUSE = 0.002
"""Seconds between the calls of a backlog, so claims and finishes meet an idle server (a
backlog has an hour before its timers are due)."""


async def key_near_timers(scripts: Scripts, stopping: asyncio.Event) -> int:
    """Write the keys of timers that came within the horizon (all of them, in batches);
    how many it wrote."""
    keyed = 0
    for _ in range(10_000):
        reply = await scripts.near(BATCH)
        keyed += int(reply[2])
        if int(reply[1]) or stopping.is_set():
            break
        await asyncio.sleep(PAUSE)  # let runs and claims go between batches
    return keyed


def next_interval(interval: float, keyed: int | None) -> float:
    """Seconds until the next turn after one that waited ``interval`` and wrote ``keyed``
    keys (None: it failed): :data:`NEAR_INTERVAL` after a turn that wrote some (more may
    be coming within the horizon) or failed; twice as long as the last, up to
    :data:`NEAR_BACKOFF` times :data:`NEAR_INTERVAL`, after one that wrote none."""
    if keyed is None or keyed > 0:
        return NEAR_INTERVAL
    return min(2 * interval, NEAR_BACKOFF * NEAR_INTERVAL)


async def keep_near_keys(scripts: Scripts, stopping: asyncio.Event) -> None:
    """A turn of :func:`key_near_timers` at once, then every :data:`NEAR_INTERVAL`
    seconds, or less often while turns find nothing to key (:func:`next_interval`),
    until ``stopping`` (a lost connection or a full server fails a turn)."""
    interval = NEAR_INTERVAL
    while not stopping.is_set():
        keyed: int | None = None
        with contextlib.suppress(*RETRYABLE):
            keyed = await key_near_timers(scripts, stopping)
        interval = next_interval(interval, keyed)
        await pause(interval, stopping)
