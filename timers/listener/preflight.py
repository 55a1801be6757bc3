"""Checks a listener makes of the server before it claims anything."""

from __future__ import annotations

import contextlib
import logging

import redis
import redis.asyncio

from timers.check import ENABLE_EVENTS, expired_events_on
from timers.encoding import as_text
from timers.listener.eviction import judge, read_policy
from timers.listener.retrying import RETRYABLE

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

