"""timers: delayed timers on Redis, fired once, on time, by whichever listener is alive.

>>> import timers
>>> tid = timers.schedule("reminders.sms", {"user_id": 42}, in_=86400)
>>> timers.cancel(tid)
True

The module-level functions use a default :class:`Timers` made on first use from
``$TIMERS_REDIS_URL`` (see :func:`configure`); ``timers.aio`` has the asyncio twins.

``import timers`` is light: it loads the errors and the functions below, and each other
name on its first use (one table, :data:`_LAZY`, read by a PEP 562 module ``__getattr__``).
So ``timers --version`` starts fast, and a web process that only schedules never loads the
listener's machinery; ``from timers import Timers`` and ``timers.Timers`` work as usual.
"""

from __future__ import annotations

import importlib
import threading
import typing
from typing import Any

from timers.exceptions import (
    EvictionUnsafe,
    InvalidArgs,
    InvalidDueTime,
    InvalidTask,
    InvalidTimer,
    InvalidTimerId,
    MalformedTimerKey,
    NotInTimer,
    NotReplicated,
    PermissionMissing,
    PoolExhausted,
    ServerError,
    ServerNotFound,
    ServerOutOfMemory,
    ServerTimeout,
    ServerUnavailable,
    TaskRefused,
    TasksUnavailable,
    TimerAlreadyPending,
    TimersError,
    WrongEventLoop,
)

if typing.TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import datetime, timedelta

    import redis

    from timers import aio as aio
    from timers.listener import Listener
    from timers.listener.context import TimerContext, current
    from timers.model.cron import CatchUp, Recurrence
    from timers.model.encoding import Args
    from timers.model.flow.rates import Rate
    from timers.model.history import HistoryRecord, MinuteStats, TimerState
    from timers.model.policy import Backoff, TaskPolicy, registered, task
    from timers.model.runs import Fired
    from timers.ops.operations import (
        Failure,
        PendingTimer,
        RetrySummary,
        Stats,
        TimerSpec,
        TimerStatus,
    )
    from timers.producer.client import AsyncTimers, Timers
    from timers.store.eviction import EvictionWarning

__all__ = [
    "AsyncTimers",
    "Backoff",
    "EvictionUnsafe",
    "EvictionWarning",
    "Failure",
    "Fired",
    "HistoryRecord",
    "InvalidArgs",
    "InvalidDueTime",
    "InvalidTask",
    "InvalidTimer",
    "InvalidTimerId",
    "Listener",
    "MalformedTimerKey",
    "MinuteStats",
    "NotInTimer",
    "NotReplicated",
    "PendingTimer",
    "PermissionMissing",
    "PoolExhausted",
    "Rate",
    "Recurrence",
    "RetrySummary",
    "ServerError",
    "ServerNotFound",
    "ServerOutOfMemory",
    "ServerTimeout",
    "ServerUnavailable",
    "Stats",
    "TaskPolicy",
    "TaskRefused",
    "TasksUnavailable",
    "TimerAlreadyPending",
    "TimerContext",
    "TimerSpec",
    "TimerState",
    "TimerStatus",
    "Timers",
    "TimersError",
    "WrongEventLoop",
    "cancel",
    "configure",
    "current",
    "every",
    "get",
    "history",
    "pause",
    "registered",
    "reschedule",
    "resume",
    "schedule",
    "schedule_many",
    "series",
    "status",
    "task",
    "tasks_seen",
    "unschedule_recurring",
]

__version__ = "0.1.0"


_LAZY: dict[str, str] = {
    "aio": "timers.aio",
    "AsyncTimers": "timers.producer.client",
    "Backoff": "timers.model.policy",
    "Failure": "timers.ops.operations",
    "Fired": "timers.model.runs",
    "Listener": "timers.listener",
    "PendingTimer": "timers.ops.pending",
    "Rate": "timers.model.flow.rates",
    "Recurrence": "timers.model.cron",
    "RetrySummary": "timers.ops.operations",
    "Stats": "timers.ops.operations",
    "TaskPolicy": "timers.model.policy",
    "TimerContext": "timers.listener.context",
    "TimerSpec": "timers.ops.operations",
    "TimerStatus": "timers.ops.status",
    "HistoryRecord": "timers.model.history",
    "MinuteStats": "timers.model.history",
    "TimerState": "timers.model.history",
    "Timers": "timers.producer.client",
    "current": "timers.listener.context",
    "registered": "timers.model.policy",
    "task": "timers.model.policy",
    "EvictionWarning": "timers.store.eviction",
}
"""The public names imported on first use, and the module each comes from."""


def __getattr__(name: str) -> Any:
    """A name of :data:`_LAZY`, imported on its first use (see the module docstring)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'timers' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if name == "aio" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


_default: Timers | None = None
_default_lock = threading.Lock()
_pinned = False
"""True while a :class:`timers.testing.TimersTest` is active: :func:`configure` (an app
factory run by a test) leaves its in-memory server in place."""


def configure(url: str | redis.Redis | None = None, **options: Any) -> Timers:
    """Set the default instance the module-level functions use: ``url`` is a URL, a
    ``redis.Redis`` the app manages (not closed by timers), or None for
    ``$TIMERS_REDIS_URL``; ``options`` as for :class:`Timers` (``prefix=`` …)."""
    global _default
    with _default_lock:
        if _pinned and _default is not None:
            return _default  # a timers.testing.TimersTest keeps its in-memory server
        if _default is not None:
            _default.close()
        from timers.producer.client import Timers

        _default = Timers(url, **options)
        return _default


def _instance() -> Timers:
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                from timers.producer.client import Timers

                _default = Timers()
    return _default


def schedule(
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
    """Run ``task`` later and return the timer id; see :meth:`Timers.schedule`."""
    return _instance().schedule(task, args, in_=in_, at=at, id=id, max_lateness=max_lateness,
                                group=group, key=key, priority=priority, replicas=replicas,
                                replicas_timeout=replicas_timeout)


def schedule_many(specs: Iterable[TimerSpec | Mapping[str, Any]], *,
                  replicas: int | None = None,
                  replicas_timeout: float | None = None) -> list[str]:
    """Schedule many timers in pipelined batches; see :meth:`Timers.schedule_many`."""
    return _instance().schedule_many(specs, replicas=replicas,
                                     replicas_timeout=replicas_timeout)


def reschedule(
    id: str, *, in_: float | timedelta | None = None, at: datetime | None = None,
    replicas: int | None = None, replicas_timeout: float | None = None,
) -> bool:
    """Move a pending timer to a new due time; False if it is not pending."""
    return _instance().reschedule(id, in_=in_, at=at, replicas=replicas,
                                  replicas_timeout=replicas_timeout)


def cancel(id: str, *, replicas: int | None = None,
           replicas_timeout: float | None = None) -> bool:
    """True if the timer was pending: it will now never fire."""
    return _instance().cancel(id, replicas=replicas, replicas_timeout=replicas_timeout)


def get(id: str) -> PendingTimer | None:
    """The pending timer with this id, or None."""
    return _instance().get(id)


def status(id: str) -> TimerStatus:
    """Where the timer is, whatever its state; see :meth:`Timers.status`."""
    return _instance().status(id)


def history(task: str | None = None, since: float | None = None, failed: bool = False,
            limit: int = 100) -> list[HistoryRecord]:
    """Ended timers, newest end first; see :meth:`Timers.history`."""
    return _instance().history(task, since, failed, limit)


def series(task: str | None = None, minutes: int = 60) -> list[MinuteStats]:
    """Per-minute runs, failures and percentiles, oldest first; see :meth:`Timers.series`."""
    return _instance().series(task, minutes)


def tasks_seen() -> list[str]:
    """The tasks with a series (runs ended in the last 24 h)."""
    return _instance().tasks_seen()


def every(
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
    return _instance().every(name, task, args, cron=cron, interval=interval, tz=tz,
                             catch_up=catch_up, max_lateness=max_lateness, overlap=overlap,
                             group=group, key=key, priority=priority)


def unschedule_recurring(name: str) -> bool:
    """Delete a recurrence and its pending occurrence; False if there was none."""
    return _instance().unschedule_recurring(name)


def pause(name: str) -> bool:
    """Stop a recurrence until :func:`resume`; False if there is none by that name."""
    return _instance().pause(name)


def resume(name: str) -> bool:
    """Schedule a paused recurrence again, from now; False if there is none."""
    return _instance().resume(name)
