"""Which event loop an asyncio client belongs to, and one client per loop.

A redis-py asyncio connection belongs to the loop that opened it: used from another, it
fails half-way (``attached to a different loop``, ``Event loop is closed``), possibly after
its command was sent. So an :class:`~timers.AsyncTimers` belongs to the first loop that
uses it and refuses, before sending anything, to run on another.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Generic, Protocol, TypeVar

from timers.exceptions import WrongEventLoop, warn_at_callers_line

WRONG_LOOP = (
    "this AsyncTimers belongs to another event loop (the first that used it): make one per "
    "loop, e.g. in your app's lifespan, and close it there with `await t.aclose()`; "
    "or use timers.aio, which keeps one client per loop")


BLOCKING_CALL = (
    "a sync timers call inside a running event loop blocks the loop for the whole Redis round "
    "trip (and any wait for a connection or a paused server): use `await timers.aio.…` or an "
    "AsyncTimers in async code")


def warn_if_blocking_a_loop() -> None:
    """Warn (a RuntimeWarning, once per calling line) when a sync call is made on a thread
    whose event loop is running: an ``async def`` endpoint calling ``timers.schedule``."""
    if asyncio._get_running_loop() is None:  # (no RuntimeError raised on every sync call)
        return
    warn_at_callers_line(BLOCKING_CALL, RuntimeWarning)


class LoopBinding:
    """The loop a client belongs to: the first one :meth:`claim` is called from.

    Only a weak reference, so a client kept after its loop is gone does not keep the loop."""

    def __init__(self) -> None:
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._lock = threading.Lock()

    def claim(self) -> None:
        """Bind to the running loop if unbound; raise :class:`WrongEventLoop` if bound to
        another (or to one that is gone)."""
        loop = asyncio.get_running_loop()
        bound = self._loop
        if bound is not None and bound() is loop:  # every call but the first
            return
        with self._lock:
            if self._loop is None:
                self._loop = weakref.ref(loop)
            elif self._loop() is not loop:
                raise WrongEventLoop(WRONG_LOOP)

    def bound(self) -> bool:
        return self._loop is not None


class Closable(Protocol):
    async def aclose(self) -> None: ...


C = TypeVar("C", bound=Closable)


class PerLoop(Generic[C]):
    """One client per event loop: made by ``make`` on a loop's first :meth:`get` (``first``
    goes to the first loop that asks), closed when that loop shuts down.

    The close rides on asyncio's own end-of-loop step: an async generator, started on the
    loop, whose ``finally`` closes the client when ``loop.shutdown_asyncgens()`` runs (as
    ``asyncio.run``, uvicorn and pytest-asyncio do before closing a loop). So two
    ``asyncio.run`` in turn each get a working client, and neither leaks its connections.
    """

    def __init__(self, make: Callable[[], C], first: C | None = None) -> None:
        self._make = make
        self._first = first
        self._clients: dict[asyncio.AbstractEventLoop, tuple[C, AsyncGenerator[None, None]]] = {}
        self._lock = threading.Lock()

    def get(self) -> C:
        """The running loop's client, made if it has none."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for gone in [other for other in self._clients if other.is_closed()]:
                del self._clients[gone]  # closed without shutdown_asyncgens: nothing to do
            if loop in self._clients:
                return self._clients[loop][0]
            client, self._first = (self._first or self._make()), None
            closer = self._close_at_shutdown(loop, client)
            self._clients[loop] = (client, closer)
        step = closer.__anext__()  # registers the generator with the loop's hooks
        with contextlib.suppress(StopIteration):
            step.send(None)  # runs it to its `yield`: no awaiting involved
        return client

    def make(self) -> C:
        """A new client as this one makes them, for the caller to own (not kept here)."""
        return self._make()

    def pop(self, loop: asyncio.AbstractEventLoop) -> C | None:
        """Forget a loop's client (the caller closes it); None if it had none."""
        with self._lock:
            entry = self._clients.pop(loop, None)
        return None if entry is None else entry[0]

    def drain(self) -> list[tuple[asyncio.AbstractEventLoop, C]]:
        """Forget every client; returns them with their loops (the caller closes them)."""
        with self._lock:
            entries, self._clients = self._clients, {}
        return [(loop, client) for loop, (client, _) in entries.items()]

    async def _close_at_shutdown(
        self, loop: asyncio.AbstractEventLoop, client: C
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                entry = self._clients.get(loop)
                mine = entry is not None and entry[0] is client
                if mine:
                    del self._clients[loop]
            if mine:
                with contextlib.suppress(Exception):  # the loop is ending: best effort
                    await client.aclose()
