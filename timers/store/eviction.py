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

The policy is read with the prefix's data format, in one round trip on the client's first
write (``CONFIG GET maxmemory-policy``; where CONFIG is not allowed, ``INFO memory``; where
neither is, the policy is unknown and nothing is said): see :mod:`timers.store.first_write`.
After it, a write costs one attribute test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from timers.exceptions import EvictionUnsafe, warn_at_callers_line
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


@dataclass
class EvictionGuard:
    """One client's check of the eviction policy, made once on its first write."""

    strict: bool = False
    checked: bool = False
    policy: str | None = None
    """The ``allkeys-*`` policy found, or None (safe, or unknown)."""

    def judge(self, found: list[str]) -> None:
        """Keep what the policies ``found`` say (the first read only), and warn once if one
        is ``allkeys-*`` and the guard is not strict (naming the app's line that wrote)."""
        if self.checked:  # asyncio: first writes in flight at once each read it; one says
            return
        self.checked, self.policy = True, risky(found)
        if self.policy is not None and not self.strict:
            warn_at_callers_line(EvictionWarning(self._message()))

    def refuse_if_strict(self) -> None:
        """Raise :class:`EvictionUnsafe` before a write, if strict and the policy is
        ``allkeys-*``."""
        if self.strict and self.policy is not None:
            raise EvictionUnsafe(f"{self._message()}; nothing was written (strict=True)")

    def _message(self) -> str:
        return (f"maxmemory-policy is {self.policy}: {ALLKEYS_LOSS}. {EVICTION_ADVICE[0].upper()}"
                f"{EVICTION_ADVICE[1:]} (listeners refuse to start on it)")
