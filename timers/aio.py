"""The asyncio twins of the module-level functions in :mod:`timers`.

>>> import timers
>>> tid = await timers.aio.schedule("reminders.sms", {"user_id": 42}, in_=60)

They use a default :class:`AsyncTimers` per event loop, made on the loop's first call from
``$TIMERS_REDIS_URL`` (see :func:`configure`) and closed when the loop ends through
``asyncio.run`` (or by :func:`aclose`): two ``asyncio.run`` in turn, or two test clients,
each get their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import redis.asyncio

from timers.exceptions import WrongEventLoop
from timers.model.cron import CatchUp, Recurrence
from timers.model.encoding import Args
from timers.model.history import HistoryRecord, MinuteStats
from timers.ops.operations import PendingTimer, TimerSpec, TimerStatus
from timers.producer.client import AsyncTimers
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
"""True while a :class:`timers.testing.TimersTest` is active (see :func:`configure`)."""
_closing: set[asyncio.Task[None] | concurrent.futures.Future[None]] = set()
"""Closes of replaced instances still under way (a reference, so they are not collected)."""


def configure(url: str | redis.asyncio.Redis | None = None, **options: Any) -> AsyncTimers:
    """Set what the functions below use: a URL (one client per event loop, each made on
    the loop's first call) or a ``redis.asyncio.Redis`` the app manages (one loop only:
    from another, :class:`WrongEventLoop`); ``options`` as for :class:`AsyncTimers`.
    Returns the instance the first loop to call will use. Inside a
    :class:`timers.testing.TimersTest` it changes nothing and returns an instance on the
    test's in-memory server.

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


async def schedule(
    task: str,
    args: Args | tuple[Any, ...] = None,
    *,
    in_: float | timedelta | None = None,
    at: datetime | None = None,
    id: str | None = None,
    max_lateness: float | timedelta | None = None,
    group: str | None = None,
    key: str | None = None,
    priority: int = 0,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
) -> str:
    """Run ``task`` later and return the timer id; see :meth:`AsyncTimers.schedule`."""
    return await _instance().schedule(task, args, in_=in_, at=at, id=id,
                                      max_lateness=max_lateness, group=group, key=key,
                                      priority=priority, replicas=replicas,
                                      replicas_timeout=replicas_timeout)


async def schedule_many(specs: Iterable[TimerSpec | Mapping[str, Any]], *,
                        replicas: int | None = None,
                        replicas_timeout: float | None = None) -> list[str]:
    """Schedule many timers in pipelined batches; see :meth:`Timers.schedule_many`."""
    return await _instance().schedule_many(specs, replicas=replicas,
                                           replicas_timeout=replicas_timeout)


async def reschedule(
    id: str, *, in_: float | timedelta | None = None, at: datetime | None = None,
    replicas: int | None = None, replicas_timeout: float | None = None,
) -> bool:
    """Move a pending timer to a new due time; False if it is not pending."""
    return await _instance().reschedule(id, in_=in_, at=at, replicas=replicas,
                                        replicas_timeout=replicas_timeout)


async def cancel(id: str, *, replicas: int | None = None,
                 replicas_timeout: float | None = None) -> bool:
    """True if the timer was pending: it will now never fire."""
    return await _instance().cancel(id, replicas=replicas, replicas_timeout=replicas_timeout)


async def get(id: str) -> PendingTimer | None:
    """The pending timer with this id, or None."""
    return await _instance().get(id)


async def status(id: str) -> TimerStatus:
    """Where the timer is, whatever its state; see :meth:`timers.Timers.status`."""
    return await _instance().status(id)


async def history(task: str | None = None, since: float | None = None, failed: bool = False,
                  limit: int = 100) -> list[HistoryRecord]:
    """Ended timers, newest end first; see :meth:`timers.Timers.history`."""
    return await _instance().history(task, since, failed, limit)


async def series(task: str | None = None, minutes: int = 60) -> list[MinuteStats]:
    """Per-minute runs, failures and percentiles, oldest first; see
    :meth:`timers.Timers.series`."""
    return await _instance().series(task, minutes)


async def tasks_seen() -> list[str]:
    """The tasks with a series (runs ended in the last 24 h)."""
    return await _instance().tasks_seen()


async def every(
    name: str,
    task: str,
    args: Args | tuple[Any, ...] = None,
    *,
    cron: str | None = None,
    interval: float | timedelta | None = None,
    tz: str = "UTC",
    catch_up: CatchUp = "latest",
    max_lateness: float | timedelta | None = None,
    overlap: bool = True,
    group: str | None = None,
    key: str | None = None,
    priority: int = 0,
) -> Recurrence:
    """Run ``task`` on a cron schedule or at an interval; see :meth:`Timers.every`."""
    return await _instance().every(name, task, args, cron=cron, interval=interval, tz=tz,
                                   catch_up=catch_up, max_lateness=max_lateness,
                                   overlap=overlap, group=group, key=key, priority=priority)


async def unschedule_recurring(name: str) -> bool:
    """Delete a recurrence and its pending occurrence; False if there was none."""
    return await _instance().unschedule_recurring(name)


async def pause(name: str) -> bool:
    """Stop a recurrence until :func:`resume`; False if there is none by that name."""
    return await _instance().pause(name)


async def resume(name: str) -> bool:
    """Schedule a paused recurrence again, from now; False if there is none."""
    return await _instance().resume(name)
