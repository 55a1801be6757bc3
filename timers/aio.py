"""The asyncio twins of the module-level functions in [`timers`][module-level-functions].

```python
import timers
tid = await timers.aio.schedule("reminders.sms", {"user_id": 42}, in_=60)
```

Each is the [`AsyncTimers`][timers.producer.async_client.AsyncTimers] method of the same name (its
parameters, its docstring), awaited on a default
[`AsyncTimers`][timers.producer.async_client.AsyncTimers] per event loop, made on the loop's first
call from ``$TIMERS_REDIS_URL`` (see [`configure`][timers.aio.configure]) and closed when the loop
ends through ``asyncio.run`` (or by [`aclose`][timers.aio.aclose]): two ``asyncio.run`` in turn, or
two test clients, each get their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import redis.asyncio

from timers.exceptions import WrongEventLoop
from timers.producer.async_client import AsyncTimers
from timers.producer.forward import on_default_async
from timers.producer.loops import PerLoop

__all__ = [
    "aclose", "cancel", "configure", "every", "get", "history", "pause", "reschedule",
    "resume", "schedule", "schedule_many", "series", "status", "tasks_seen",
    "unschedule_recurring",
]

ONE_LOOP_CLIENT = (
    "timers.aio was configured with a redis.asyncio client, which belongs to the first event "
    "loop that used it: configure timers.aio with a URL (one client per loop), or call "
    "timers.aio.configure(client) again in this loop")

_default: PerLoop[AsyncTimers] = PerLoop(AsyncTimers)
"""The default instances, one per event loop."""
_default_lock = threading.Lock()
_pinned = False
"""True while a [`timers.testing.TimersTest`][timers.testing.TimersTest] is active (see
[`configure`][timers.aio.configure])."""
_closing: set[asyncio.Task[None] | concurrent.futures.Future[None]] = set()
"""Closes of replaced instances still under way (a reference, so they are not collected)."""


def configure(url: str | redis.asyncio.Redis | None = None, **options: Any) -> AsyncTimers:
    """Set what the functions below use: a URL (one client per event loop, each made on
    the loop's first call) or a ``redis.asyncio.Redis`` the app manages (one loop only:
    from another, [`WrongEventLoop`][timers.exceptions.WrongEventLoop]); ``options`` as for
    [`AsyncTimers`][timers.producer.async_client.AsyncTimers]. Returns the instance the first loop
    to call will use. Inside a [`timers.testing.TimersTest`][timers.testing.TimersTest] it changes
    nothing and returns an instance on the test's in-memory server.

    The instances it replaces are closed on the loops their connections belong to: at once
    if a loop is not running (and not closed), else as a task on it. One whose loop is
    closed already cannot be closed by asyncio; its sockets close when it is collected.
    """
    global _default
    with _default_lock:
        if _pinned:  # a timers.testing.TimersTest keeps its in-memory server
            return _default.make()
    first = AsyncTimers(url, **options)
    if isinstance(url, redis.asyncio.Redis):
        new = PerLoop(_refuse_another_loop, first)
    else:
        new = PerLoop(lambda: AsyncTimers(url, **options), first)
    with _default_lock:
        old, _default = _default, new
    for loop, client in old.drain():
        _close_on(client, loop)
    return first


def _refuse_another_loop() -> AsyncTimers:
    raise WrongEventLoop(ONE_LOOP_CLIENT)


async def aclose() -> None:
    """Close the running loop's default client (the next call here makes a new one).

    An app calls it when it stops (e.g. at the end of its lifespan); a loop that ends
    through ``asyncio.run`` closes its default client by itself."""
    with _default_lock:
        client = _default.pop(asyncio.get_running_loop())
    if client is not None:
        await client.aclose()


def _close_on(old: AsyncTimers, loop: asyncio.AbstractEventLoop) -> None:
    if loop.is_closed():
        return
    if not loop.is_running():
        loop.run_until_complete(old.aclose())
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        task = loop.create_task(old.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
    else:
        future = asyncio.run_coroutine_threadsafe(old.aclose(), loop)
        _closing.add(future)
        future.add_done_callback(_closing.discard)


def _instance() -> AsyncTimers:
    with _default_lock:
        default = _default
    return default.get()


schedule = on_default_async(AsyncTimers.schedule, _instance, __name__)
schedule_many = on_default_async(AsyncTimers.schedule_many, _instance, __name__)
reschedule = on_default_async(AsyncTimers.reschedule, _instance, __name__)
cancel = on_default_async(AsyncTimers.cancel, _instance, __name__)
get = on_default_async(AsyncTimers.get, _instance, __name__)
status = on_default_async(AsyncTimers.status, _instance, __name__)
history = on_default_async(AsyncTimers.history, _instance, __name__)
series = on_default_async(AsyncTimers.series, _instance, __name__)
tasks_seen = on_default_async(AsyncTimers.tasks_seen, _instance, __name__)
every = on_default_async(AsyncTimers.every, _instance, __name__)
unschedule_recurring = on_default_async(AsyncTimers.unschedule_recurring, _instance, __name__)
pause = on_default_async(AsyncTimers.pause, _instance, __name__)
resume = on_default_async(AsyncTimers.resume, _instance, __name__)
