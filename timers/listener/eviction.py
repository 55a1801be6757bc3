"""What a listener does about Redis eviction (``maxmemory-policy``).

``allkeys-*`` may evict the due index and the timer records themselves: every pending
timer lost, silently. The listener refuses to start on it unless told to accept that
(``--allow-eviction``). ``volatile-*`` evicts only keys with a TTL, the expiring timer keys:
their events are lost and the sweeper fires those timers from the due index all the same.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from timers.exceptions import EvictionUnsafe
from timers.model.encoding import as_text
from timers.store.eviction import ALLKEYS_LOSS, EVICTION_ADVICE

__all__ = ["EvictionUnsafe", "judge", "read_policy", "report_late_finishes"]

log = logging.getLogger("timers.listener")


async def read_policy(client: Any) -> str | None:
    """``maxmemory-policy``, or None when CONFIG is not allowed (managed services)."""
    try:
        reply = await client.config_get("maxmemory-policy")
    except redis.ResponseError:
        return None
    value = next(iter(reply.values()), None)
    return None if value is None else as_text(value)


def judge(policy: str | None, allow: bool) -> None:
    """Raise :class:`EvictionUnsafe` on ``allkeys-*`` unless ``allow``; log what can be
    lost otherwise."""
    if policy is None or not policy.startswith("allkeys-"):
        if policy is not None and policy.startswith("volatile-"):
            log.info("maxmemory-policy %s: Redis may evict expiring timer keys; their events "
                     "are lost and the sweeper fires those timers from the due index", policy)
        return
    if not allow:
        raise EvictionUnsafe(
            f"maxmemory-policy is {policy}: {ALLKEYS_LOSS}. Either {EVICTION_ADVICE}, or "
            f"start with --allow-eviction to accept that")
    log.warning("maxmemory-policy is %s (allowed by --allow-eviction): %s if Redis reaches "
                "maxmemory", policy, ALLKEYS_LOSS)


def report_late_finishes(count: int, policy: str | None) -> None:
    """Endings of runs this listener held that Redis no longer had: never silent."""
    if count <= 0:
        return
    cause = (f"likely evicted (maxmemory-policy {policy})" if policy and
             policy.startswith("allkeys-") else
             "the listener stalled past its lease (another listener may have run them "
             "again), or the keys were evicted or flushed (allkeys-* eviction, FLUSHDB)")
    log.error("%d run(s) this listener held were gone from Redis when they ended: %s",
              count, cause)
