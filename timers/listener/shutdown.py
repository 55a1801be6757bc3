"""A lane's way out: its running tasks get their time, the rest are handed back, and its
loops end after the endings already on their way."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from timers.listener.endings import Ending, EndingWriter

if TYPE_CHECKING:
    from timers.listener.lifecycle import Listener

log = logging.getLogger("timers.listener")

FLUSH_GRACE = 5.0  # s a batch of endings already sent may take to be answered at shutdown
HAND_BACK_GRACE_MS = 1000
"""A run handed back at the end may still be going in its thread until the process exits
(a thread cannot be stopped): a concurrency key slot it holds stays held this long, and
its timer comes due again then, so the key never runs two at once (``finish.lua``)."""


async def drain(self: Listener) -> None:
    """Wait for running tasks, then hand back the runs that did not finish."""
    running = [t for t in self._tasks if not t.done()]
    await self.recycler.wait_for_runs(running, lambda: self._heartbeat(alive=True))
    running = [t for t in running if not t.done()]
    if running and not self.aborted:
        log.info("waiting up to %gs for %d running task(s)", self.shutdown_timeout,
                 len(running))
        waiter = asyncio.create_task(self._abort_event.wait())
        everything: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
        either: list[asyncio.Future[Any]] = [everything, waiter]
        await asyncio.wait(either, timeout=self.shutdown_timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    unfinished = list(self._running.values())
    for run in unfinished:
        self._running.pop(run.token, None)
        self.endings.add(Ending.release(run.token, HAND_BACK_GRACE_MS))
    for task in self._tasks:
        task.cancel()
    if unfinished:
        self.tally.hand_back([run.timer_id for run in unfinished])


async def end_loops(endings: EndingWriter, loops: list[asyncio.Task[None]]) -> None:
    """Cancel the loops, but let a batch of endings on its way finish first: a write
    cancelled after Redis ran it would be sent again and count as late finishes."""
    writers = [t for t in loops if t.get_name() == "timers-finish"]
    endings.ready.set()  # the writer sees the close flag and ends after its batch
    await asyncio.wait(writers, timeout=FLUSH_GRACE)
    for loop_task in loops:
        loop_task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
