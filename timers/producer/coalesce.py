"""Concurrent ``AsyncTimers.schedule`` calls share round trips.

A web app schedules from many requests at once; each call alone costs a round trip and a
script call. A call made while none of this client's is queued or in flight goes straight
to the wire, in the caller's own task (no loop turn, no task, no future: a lone awaited call
costs one round trip). Calls made while others are queued or in flight are queued, and
those of one turn of the event loop are sent together, as one ``schedule_many`` (one script
call per chunk, in one MULTI/EXEC), the way ioredis pipelines concurrent commands. Calls
are written in the order they are made (those of one batch in one script call, in order);
calls on different connections may run in either order on the server, as separate calls
in flight at once always could. Each caller still gets its own id, or its own error:

- bad input is refused in the caller's own call, before anything is queued;
- an error of the shared round trip (Redis away, a full server) reaches every caller of
  that batch as its own exception, and nothing of the batch was written (a full server
  refuses the whole MULTI/EXEC);
- a caller cancelled before its batch is sent writes nothing; one cancelled later (or a
  lone call cancelled in flight) may have its timer written, as any call cancelled in
  flight may; the other callers of its batch are not affected.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from timers.exceptions import NotReplicated, ServerOutOfMemory

P = TypeVar("P")

MAX_BATCH = 1000
"""Timers per shared round trip at most (more callers at once make more batches)."""


class Coalescer(Generic[P]):
    """Sends a lone timer at once, and gathers the prepared timers of one loop turn while
    others are in flight; ``send`` sends a list and returns their ids in order."""

    def __init__(self, send: Callable[[list[P]], Awaitable[list[str]]],
                 id_of: Callable[[P], str]) -> None:
        self._send, self._id_of = send, id_of
        self._queue: list[tuple[P, asyncio.Future[str]]] = []
        self._turn_pending = False
        self._in_flight: set[asyncio.Task[None]] = set()
        self._alone = 0
        """Lone calls on the wire."""
        self._none_alone: asyncio.Event | None = None
        """Set when the last lone call is done (only while :meth:`drain` waits for it)."""

    async def schedule(self, prepared: P) -> str:
        """Send one timer and return its id: at once if no other call is queued or in
        flight, else with the calls of this turn (its batch's error is raised as its own)."""
        if not (self._alone or self._in_flight or self._queue):
            self._alone += 1
            try:
                return (await self._send([prepared]))[0]
            finally:
                self._alone -= 1
                if not self._alone and self._none_alone is not None:
                    self._none_alone.set()
        return await self._queued(prepared)

    def _queued(self, prepared: P) -> asyncio.Future[str]:
        """Queue one timer for the end of this turn: the future of its id."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        self._queue.append((prepared, future))
        if not self._turn_pending:
            self._turn_pending = True
            loop.call_soon(self._send_queued)
        return future

    def _send_queued(self) -> None:
        self._turn_pending = False
        queued, self._queue = self._queue, []
        live = [(p, f) for p, f in queued if not f.done()]  # cancelled callers drop out
        for start in range(0, len(live), MAX_BATCH):
            task = asyncio.get_running_loop().create_task(
                self._send_batch(live[start:start + MAX_BATCH]))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _send_batch(self, batch: list[tuple[P, asyncio.Future[str]]]) -> None:
        try:
            ids = await self._send([p for p, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for prepared, future in batch:
                if not future.done():
                    future.set_exception(self._own_error(exc, self._id_of(prepared)))
            return
        for (_, future), timer_id in zip(batch, ids, strict=True):
            if not future.done():
                future.set_result(timer_id)

    @staticmethod
    def _own_error(exc: Exception, timer_id: str) -> Exception:
        """A copy of the batch's error for one caller (its ``written`` says only whether
        that caller's timer was written; a :class:`NotReplicated`'s ``timer_ids``, whether
        that caller's is among those not confirmed)."""
        own = copy.copy(exc)
        if isinstance(own, ServerOutOfMemory):
            own.written = [timer_id] if timer_id in exc.written else []  # type: ignore[attr-defined]
        if isinstance(own, NotReplicated):
            own.timer_ids = [timer_id] if timer_id in exc.timer_ids else []  # type: ignore[attr-defined]
        own.__cause__ = exc.__cause__
        return own

    async def drain(self) -> None:
        """Wait for the calls in flight (before the connections close)."""
        while self._queue or self._in_flight or self._alone:
            if self._queue:
                await asyncio.sleep(0)
            elif self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)
            else:
                self._none_alone = asyncio.Event()
                try:
                    await self._none_alone.wait()
                finally:
                    self._none_alone = None
