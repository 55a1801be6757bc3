"""Checks a listener makes of the server before it claims anything (the prefix's data
format first), and the shard layout it reads there."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis
import redis.asyncio
import redis.exceptions

from timers.exceptions import ShardLayoutMismatch
from timers.listener.eviction import judge, read_policy
from timers.listener.retrying import RETRYABLE, Retry
from timers.model.data_format import FORMAT, refusal
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.ops.shards import ShardLayout, resolve_layout, wanted_count
from timers.store.check import ENABLE_EVENTS, expired_events_on
from timers.store.permissions import is_permanent
from timers.store.scripts import Scripts

log = logging.getLogger("timers.listener")


async def check_format(client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
                       keys: Keyspace, stopping: asyncio.Event) -> None:
    """Give the prefix this release's data format if it has none yet (``SET P|format
    NX``), and refuse to start on one newer than this release knows
    ([`UnknownFormat`][timers.exceptions.UnknownFormat]: nothing was written), in one round
    trip, before anything else is written (`timers.model.data_format`).

    Tried until Redis answers (or the listener is stopped). A write Redis refuses (a full
    server) leaves the key absent, which is format 1: the next listener writes it. A
    read refused for good (an ACL without ``GET`` on the key) is logged, and the listener
    starts without the check."""
    key = keys.data_format

    async def check() -> None:
        try:
            pipe = client.pipeline(transaction=False)
            pipe.set(key, FORMAT, nx=True)
            pipe.get(key)
            _, stored = await pipe.execute(raise_on_error=False)
            if isinstance(stored, Exception):
                raise stored
        except RETRYABLE as exc:
            if not is_permanent(exc):
                raise
            log.warning("cannot read the prefix's data format at %s (%s): starting "
                        "without checking it", key, exc)
            return
        refused = refusal(stored, key, "listener")
        if refused is not None:
            raise refused

    await Retry(stopping, told="cannot read the prefix's data format yet (%s); will keep "
                "trying").answer(check)


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


async def read_layout(scripts: Scripts, keys: Keyspace, prefix: str, shards: int | None,
                      cluster: bool, stopping: asyncio.Event) -> ShardLayout | None:
    """The prefix's layout, fixed now if this is its first use; tried until Redis answers
    (None: the listener was stopped first). A layout other than ``shards`` asked for is
    an error (:class:`timers.exceptions.ShardLayoutMismatch`)."""
    wanted, store = wanted_count(cluster, shards)
    call = scripts.calls.shards(wanted, store)

    async def layout() -> ShardLayout:
        try:
            reply = await scripts.run(call)
        except redis.exceptions.ResponseError as exc:
            if "timers shards" in str(exc):  # a garbled stored count: no retry mends it
                raise ShardLayoutMismatch(str(exc).removeprefix("timers shards: ")) from None
            raise
        return resolve_layout(keys, prefix, shards, reply)

    return await Retry(stopping, told="cannot read the prefix's shard layout yet (%s); will "
                       "keep trying").answer(layout)
