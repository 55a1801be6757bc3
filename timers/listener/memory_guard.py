"""A listener on a full Redis (``maxmemory`` reached under ``noeviction``).

The claim script declares no ``allow-oom`` flag, so a full server refuses it before its
first write; renewals and endings declare it and go on. The listener then stops claiming,
keeps the leases it holds, says so once, and claims again as soon as memory frees: a
refused claim costs Redis next to nothing (it is turned away before it runs), so it is
tried again every ``RETRY`` seconds, and a timer held back by a full server starts within
that long of memory being free (invariant 10).
"""

from __future__ import annotations

import logging

log = logging.getLogger("timers.listener")
RETRY = 0.02


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
        return RETRY

    def claimed(self) -> None:
        """A claim went through: memory is back, if it was short."""
        if self.full:
            self.full = False
            log.warning("Redis has memory again: claiming timers")
