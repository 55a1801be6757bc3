"""Checks a listener makes of the server before it claims anything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import redis
import redis.asyncio

from timers.check import ENABLE_EVENTS, expired_events_on
from timers.encoding import as_text
from timers.listener.eviction import judge, read_policy
from timers.listener.lanes import lanes_of, read_layout
from timers.listener.permissions import SWEEP_ONLY_MAX_SLEEP, check_at_start
from timers.listener.retrying import RETRYABLE

if TYPE_CHECKING:
    from timers.listener.lifecycle import Listener

log = logging.getLogger("timers.listener")


async def warn_if_events_off(client: redis.asyncio.Redis) -> None:
    """Warn (once, at start) when Redis publishes no ``expired`` events."""
    try:
        reply = await client.config_get("notify-keyspace-events")
    except redis.ResponseError as exc:
        log.warning(
            "cannot read notify-keyspace-events (%s): timers will fire through the "
            "sweeper alone, which stays on time", exc)
        return
    except RETRYABLE as exc:
        log.warning("cannot reach Redis yet (%s); will keep trying", exc)
        return
    flags = as_text(next(iter(reply.values()), None) or b"")
    if not expired_events_on(flags):
        log.warning(
            "KEYSPACE EVENTS ARE OFF (notify-keyspace-events=%r): timers fire through "
            "the due-driven sweeper alone. Turn expired events on with %s",
            flags, ENABLE_EVENTS)


async def eviction_policy(client: redis.asyncio.Redis, allow_eviction: bool) -> str | None:
    """The server's maxmemory-policy (None if unread); :class:`EvictionUnsafe` where Redis
    may evict the due index (see :mod:`timers.listener.eviction`)."""
    policy: str | None = None
    with contextlib.suppress(*RETRYABLE):
        policy = await read_policy(client)
    judge(policy, allow_eviction)
    return policy


async def preflight(self: Listener) -> bool:
    """Load the tasks and check the server before any claim; False: no events (the
    Redis user may not subscribe, the sweeper works alone)."""
    try:
        # the whole tasks package, off the loop
        await asyncio.to_thread(self.loader.load_at_start, self._tasks_optional)
        await warn_if_events_off(self.redis)
        self.endings.eviction_policy = await eviction_policy(self.redis,
                                                             self.allow_eviction)
        missing = await check_at_start(self.redis, self.keys, self.db)
        layout = await read_layout(self)
        if layout is not None:
            self._lanes[:] = lanes_of(self, layout)
        self.recycler.start(asyncio.get_running_loop())  # the tasks are loaded: RSS
    except Exception:
        if self._owns_client:
            await self.redis.aclose()
        raise
    if missing:
        for lane in self._lanes:
            lane.tracker.max_sleep = min(lane.tracker.max_sleep, SWEEP_ONLY_MAX_SLEEP)
    return "events" not in missing
