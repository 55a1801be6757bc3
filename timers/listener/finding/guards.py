"""What stops a lane's claims for a while, and says so once each way.

- A full server (``maxmemory`` reached under ``noeviction``) refuses the claim script,
  which declares no ``allow-oom`` flag, before its first write; renewals and endings
  declare it and go on. The claimer stops claiming (the leases are kept) and tries again
  every :data:`OOM_RETRY` seconds: a refused claim costs Redis next to nothing, and a timer
  held back by a full server starts within that long of memory being free (invariant 10).
- Too few replicas (``replicas=n``, :mod:`timers.store.replicated`): a claim whose write
  fewer than ``n`` replicas had in time starts none of its runs, and each claim after it
  would take a batch more that waits out its lease. The claimer claims nothing more
  until ``WAIT n`` alone finds ``n`` replicas (figures: bench/FINDINGS.md, "Claims held
  while replicas are short").
"""

from __future__ import annotations

import asyncio
import logging

from timers.store.replicated import UnreplicatedReply

log = logging.getLogger("timers.listener")

OOM_RETRY = 0.02
"""Seconds between claims a full server refuses."""


class MemoryGuard:
    """Logs a full server once when claims start being refused and once when they succeed
    again; tells the sweep loop how long to wait before the next try."""

    def __init__(self) -> None:
        self.full = False

    def refused(self, exc: BaseException) -> float:
        """A claim was refused for want of memory: the seconds to wait before trying again."""
        if not self.full:
            self.full = True
            log.warning("Redis is out of memory (maxmemory reached, %s): not claiming new "
                        "timers until it frees; leases kept", str(exc).rstrip(". ") or "OOM")
        return OOM_RETRY

    def claimed(self) -> None:
        """A claim went through: memory is back, if it was short."""
        if self.full:
            self.full = False
            log.warning("Redis has memory again: claiming timers")


class ReplicaGuard:
    """Holds a lane's claims from a claim too few replicas had until they are back."""

    def __init__(self) -> None:
        self.short: UnreplicatedReply | None = None
        """The last claim's reply, while too few replicas had it."""

    def fell_short(self, reply: UnreplicatedReply, runs: int) -> None:
        """A claim's ``reply`` gave ``runs`` runs (none started): claim no more."""
        if runs:
            log.warning(reply.held_back(runs, "claimed"))
        if self.short is None:
            log.warning("not claiming until %d replica(s) are in sync (WAIT %d %d, asked "
                        "again until they are)", reply.replicas, reply.replicas,
                        reply.timeout_ms)
        self.short = reply

    async def ready(self, stopping: asyncio.Event) -> bool:
        """Once enough replicas are in sync, or at once when no claim fell short: True;
        False when the listener stops first (each ask waits up to the timeout)."""
        short = self.short
        if short is None:
            return True
        while not stopping.is_set():
            acked = await short.ask_again()
            if acked >= short.replicas:
                self.short = None
                log.warning("%d replica(s) in sync again: claiming", acked)
                return True
        return False
