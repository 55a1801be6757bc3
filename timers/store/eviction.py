"""A producer writing into a server that may evict timers: warned once, or refused.

Under an ``allkeys-*`` ``maxmemory-policy`` Redis may evict any key once it reaches
``maxmemory``: the due index and the timer records too, so every pending timer is lost,
silently (measured: 5,000 scheduled, then evicted). A listener refuses to start on such a
server; a producer (:class:`timers.Timers`, :class:`timers.AsyncTimers`, the module-level
functions) checks the policy once per client, on its first write, and caches it:

- by default it warns once per client (:class:`EvictionWarning`, a ``UserWarning``),
  naming the server, the policy and why it loses timers;
- with ``strict=True`` it raises :class:`~timers.exceptions.EvictionUnsafe` instead, on
  that write and every later one, before writing anything.

The check costs one round trip on the client's first write (``CONFIG GET
maxmemory-policy``; where CONFIG is not allowed, ``INFO memory``; where neither is, the
policy is unknown and nothing is said) and one attribute test per write after it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from timers.exceptions import EvictionUnsafe
from timers.model.encoding import as_text

EVICTION_ADVICE = "set maxmemory-policy noeviction (or a volatile-* policy)"
ALLKEYS_LOSS = ("Redis may evict the due index and the timer records themselves: every "
                "pending timer lost, silently")


class EvictionWarning(UserWarning):
    """The server's eviction policy may evict pending timers (``allkeys-*``)."""


def policies(reply: Any) -> list[str]:
    """Every ``maxmemory-policy`` in a ``CONFIG GET`` or ``INFO memory`` reply: one from
    a server, one per node from a cluster client (a mapping of node to reply)."""
    if not isinstance(reply, Mapping):
        return []
    found = []
    for key, value in reply.items():
        if isinstance(value, Mapping):
            found += policies(value)
        elif as_text(key) in ("maxmemory-policy", "maxmemory_policy"):
            found.append(as_text(value))
    return found


def risky(found: list[str]) -> str | None:
    """The first ``allkeys-*`` policy among ``found``, if any."""
    return next((p for p in found if p.startswith("allkeys-")), None)


_READ_ERRORS = (redis.exceptions.ResponseError,)
"""A server that refuses CONFIG (a managed service, an ACL) answers with one of these."""


@dataclass
class EvictionGuard:
    """One client's check of the eviction policy, made once on its first write."""

    strict: bool = False
    checked: bool = False
    policy: str | None = None
    """The ``allkeys-*`` policy found, or None (safe, or unknown)."""

    def read_sync(self, client: Any) -> None:
        """Read the policy over a sync client (nothing if it was read already)."""
        if self.checked:
            return
        try:
            try:
                found = policies(client.config_get("maxmemory-policy"))
            except _READ_ERRORS:
                found = policies(client.info("memory"))
        except _READ_ERRORS:
            found = []
        except redis.exceptions.RedisError:
            return  # not reachable now: the write says so; check on the next one
        self._judge(found)

    async def read_async(self, client: Any) -> None:
        """:meth:`read_sync` over an asyncio client."""
        if self.checked:
            return
        try:
            try:
                found = policies(await client.config_get("maxmemory-policy"))
            except _READ_ERRORS:
                found = policies(await client.info("memory"))
        except _READ_ERRORS:
            found = []
        except redis.exceptions.RedisError:
            return
        self._judge(found)

    def _judge(self, found: list[str]) -> None:
        if self.checked:  # asyncio: first writes in flight at once each read it; one says
            return
        self.checked, self.policy = True, risky(found)
        if self.policy is not None and not self.strict:
            warnings.warn(EvictionWarning(self._message()), stacklevel=5)

    def refuse_if_strict(self) -> None:
        """Raise :class:`EvictionUnsafe` before a write, if strict and the policy is
        ``allkeys-*``."""
        if self.strict and self.policy is not None:
            raise EvictionUnsafe(f"{self._message()}; nothing was written (strict=True)")

    def _message(self) -> str:
        return (f"maxmemory-policy is {self.policy}: {ALLKEYS_LOSS}. {EVICTION_ADVICE[0].upper()}"
                f"{EVICTION_ADVICE[1:]} (listeners refuse to start on it)")
