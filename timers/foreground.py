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
import logging
import signal
import time
from collections.abc import Callable
from typing import Protocol

import redis

from timers.exceptions import TimersError
from timers.listener.connection import listener_client
from timers.listener.orphans import (
    SAME_STOP_WINDOW,
    ask_for_signal_on_parent_death,
    supervisor_pid,
    watch_parent,
)
from timers.redact import mask_secrets

log = logging.getLogger("timers")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class CannotConnect(TimersError):
    """The listener's server did not answer a PING."""


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

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


class ForegroundListener(Stoppable, Protocol):
    redis: redis.asyncio.Redis

    async def run(self, stop: asyncio.Event | None = None, *, burst: bool = False) -> None: ...


async def check_connection(client: redis.asyncio.Redis, where: str, *,
                           wait: bool = False) -> None:
    """Raise :class:`CannotConnect` (one line, no password) if the server does not answer;
    with ``wait``, try again with backoff until it does.

    A supervised child waits: its supervisor checked the server once before starting
    children, so a child that cannot connect later (a replacement, a standby, a restart
    during an outage) exiting at once would be restarted at once and use up the restart
    budget in seconds, taking the whole fleet down with it."""
    delay = 0.25
    while True:
        try:
            await client.ping()
            return
        except (redis.exceptions.ConnectionError, redis.exceptions.RedisClusterException) as exc:
            # (a cluster client that reaches no node raises the latter)
            problem = mask_secrets(f"cannot connect to Redis at {where}: {exc}")
            if not wait:
                await client.aclose()
                raise CannotConnect(f"{problem} (set --url or $TIMERS_REDIS_URL; "
                                    f"`timers server` starts one)") from None
        if delay == 0.25:
            log.warning("%s; trying again until it answers", problem)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


def check_server_once(url: str, where: str) -> None:
    """The supervisor, before it starts children: raise :class:`CannotConnect` if the
    server does not answer (the children would wait for it)."""
    async def ping() -> None:
        client = listener_client(url)
        try:
            await check_connection(client, where)
        finally:
            await client.aclose()

    asyncio.run(ping())


async def run_in_foreground(listener: ForegroundListener, *, burst: bool = False) -> None:
    """Run ``listener`` until it is done (``burst``) or stopped by a signal."""
    loop = asyncio.get_running_loop()
    parent = supervisor_pid()
    handler = StopOnSignals(listener, SAME_STOP_WINDOW if parent is not None else 0.0)
    handler.install(loop)
    watcher = None
    if parent is not None:
        ask_for_signal_on_parent_death()
        watcher = asyncio.create_task(watch_parent(parent, handler))
    try:
        await listener.run(burst=burst)
    finally:
        handler.uninstall(loop)
        if watcher is not None:
            watcher.cancel()
