"""A listener on a full Redis (``maxmemory`` reached under ``noeviction``).

The claim script declares no ``allow-oom`` flag, so a full server refuses it before its
first write; renewals and endings declare it and go on. The listener then stops claiming,
keeps the leases it holds, says so once, and claims again once memory frees (a claim is
tried every few seconds, and on every wake-up: a finished run frees memory).
"""

from __future__ import annotations

import logging

log = logging.getLogger("timers.listener")
FIRST_WAIT = 0.25
MAX_WAIT = 2.0


class MemoryGuard:
    """Logs a full server once when claims start being refused and once when they succeed
    again; tells the sweep loop how long to wait before the next try."""

    def __init__(self) -> None:
        self.full = False
        self._wait = FIRST_WAIT

    def refused(self, exc: BaseException) -> float:
        """A claim was refused for want of memory: the seconds to wait before trying again."""
        if not self.full:
            self.full = True
            log.warning("Redis is out of memory (maxmemory reached, %s): not claiming new "
                        "timers until it frees; leases kept", str(exc).rstrip(". ") or "OOM")
        wait, self._wait = self._wait, min(self._wait * 2, MAX_WAIT)
        return wait

    def claimed(self) -> None:
        """A claim went through: memory is back, if it was short."""
        self._wait = FIRST_WAIT
        if self.full:
            self.full = False
            log.warning("Redis has memory again: claiming timers")
