"""Running one listener in the foreground of a process, as ``timers listen`` does.

The first SIGTERM, SIGINT or SIGHUP (a closed terminal, a service manager's reload) stops
the listener gracefully: running tasks get the shutdown timeout, the rest is handed back.
A second one aborts at once. A listener started by a supervisor stops too when that
supervisor dies (see :mod:`timers.orphans`), and takes a signal that comes within
``SAME_STOP_WINDOW`` of the first as the same stop: a service manager that signals every
process of the service reaches it twice at once, directly and through the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Callable
from typing import Protocol

import redis

from timers.exceptions import CannotConnect
from timers.listener.defaults import WAIT_FOR_REDIS
from timers.listener.retrying import ReconnectDelays
from timers.listener.supervision.orphans import SAME_STOP_WINDOW, supervisor_pid, watch_parent
from timers.model.redact import mask_secrets
from timers.store.listener_client import listener_client
from timers.store.server_errors import cannot_connect

log = logging.getLogger("timers")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stoppable(Protocol):
    def stop(self) -> None: ...

    def abort(self) -> None: ...


class StopOnSignals:
    """Signal escalation: the first signal stops gracefully, any later one aborts, except
    one within ``same_stop_window`` seconds of the first (the same stop, sent twice)."""

    def __init__(self, target: Stoppable, same_stop_window: float = 0.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.seen = 0
        self.same_stop_window = same_stop_window
        self._monotonic = monotonic
        self._first = 0.0

    def __call__(self) -> None:
        self.seen += 1
        if self.seen == 1:
            self._first = self._monotonic()
            log.info("stopping: waiting for running tasks (signal again to exit at once)")
            self.target.stop()
        elif self._monotonic() - self._first < self.same_stop_window:
            self.seen = 1
            log.debug("a second stop signal at once: the same stop (from the supervisor "
                      "and the service manager both)")
        else:
            self.target.abort()

    def stop_once(self) -> None:
        """Stop gracefully, as the first signal does, unless stopping already: the
        supervisor's death seen a second way (after ``PR_SET_PDEATHSIG``'s SIGTERM) is
        the same stop, never an abort."""
        if self.seen == 0:
            self()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


class ForegroundListener(Stoppable, Protocol):
    redis: redis.asyncio.Redis

    async def run(self, stop: asyncio.Event | None = None, *, burst: bool = False) -> None: ...




async def wait_for_server(client: redis.asyncio.Redis, where: str, *,
                          wait: float = WAIT_FOR_REDIS,
                          monotonic: Callable[[], float] = time.monotonic) -> bool:
    """Return True once the server answers a PING; try again, 0.5 s doubling to 5 s
    apart, a line logged per try, for up to ``wait`` seconds (``math.inf``: until it
    answers), then raise :class:`CannotConnect` (one line, no password). A stop signal
    (SIGTERM, SIGINT, SIGHUP) while it waits returns False: nothing was started.

    A supervised child waits without limit: its supervisor reached the server before
    starting children, so a child that cannot connect later (a replacement, a standby, a
    restart during an outage) exiting at once would be restarted at once and use up the
    restart budget in seconds, taking the whole fleet down with it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        deadline, delays, attempt = monotonic() + wait, ReconnectDelays(0.5, 5.0), 0
        while True:
            attempt, delay = attempt + 1, delays.next()
            try:
                await client.ping()
                return True
            except (redis.exceptions.AuthenticationError,
                    redis.exceptions.AuthorizationError) as exc:
                await client.aclose()  # not something waiting mends
                raise CannotConnect(mask_secrets(
                    f"Redis at {where} refused the credentials: {exc}")) from None
            except (redis.exceptions.ConnectionError,
                    redis.exceptions.RedisClusterException) as exc:
                # (a cluster client that reaches no node raises the latter)
                problem = mask_secrets(cannot_connect(where, exc))
            left = deadline - monotonic()
            if left <= 0:
                await client.aclose()
                waited = f" (waited {wait:g} s: --wait-for-redis)" if wait > 0 else ""
                raise CannotConnect(f"{problem}{waited}")
            log.warning("%s; try %d, next in %.1f s (%s)", problem, attempt, min(delay, left),
                        "waiting until it answers" if math.isinf(wait)
                        else f"giving up in {left:.1f} s", extra={"attempt": attempt})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(delay, left))
            if stop.is_set():
                log.info("stopped while waiting for Redis at %s", where)
                return False
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def wait_for_server_at(url: str, where: str, wait: float) -> bool:
    """:func:`wait_for_server` for the supervisor, before it starts children (they wait
    for the server themselves later)."""
    async def ping() -> bool:
        client = listener_client(url)
        try:
            return await wait_for_server(client, where, wait=wait)
        finally:
            await client.aclose()

    return asyncio.run(ping())


async def run_in_foreground(listener: ForegroundListener, *, burst: bool = False) -> None:
    """Run ``listener`` until it is done (``burst``) or stopped by a signal."""
    loop = asyncio.get_running_loop()
    parent = supervisor_pid()
    handler = StopOnSignals(listener, SAME_STOP_WINDOW if parent is not None else 0.0)
    handler.install(loop)
    watcher = None
    if parent is not None:  # (PR_SET_PDEATHSIG was asked for at the process's start)
        watcher = asyncio.create_task(watch_parent(parent, handler.stop_once,
                                                   listener.abort))
    try:
        await listener.run(burst=burst)
    finally:
        handler.uninstall(loop)
        if watcher is not None:
            watcher.cancel()
