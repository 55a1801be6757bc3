"""timers: delayed timers on Redis, fired once, on time, by whichever listener is alive.

```python
import timers
tid = timers.schedule("reminders.sms", {"user_id": 42}, in_=86400)
timers.cancel(tid)  # True
```

Each module-level function is the [`Timers`][timers.producer.client.Timers] method of the same name
(its parameters, its docstring) called on a default [`Timers`][timers.producer.client.Timers] made
on first use from ``$TIMERS_REDIS_URL`` (see [`configure`][timers.configure]); ``timers.aio`` has
the asyncio twins.

``import timers`` is light: it loads the errors and [`configure`][timers.configure], and each other
name on its first use (`_OPERATIONS` and one table, `_LAZY`, read by a PEP 562 module
``__getattr__``).
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
    UnknownFormat,
    WrongEventLoop,
)

if typing.TYPE_CHECKING:
    import redis

    from timers import aio as aio
    from timers.listener import Listener
    from timers.listener.calling.context import TimerContext, current
    from timers.model.cron import Recurrence
    from timers.model.flow.rates import Rate
    from timers.model.history import HistoryRecord, MinuteStats, TimerState
    from timers.model.policy import Backoff, TaskPolicy, registered, task
    from timers.model.runs import Fired
    from timers.ops.listings import Stats
    from timers.ops.operations import (
        Failure,
        PendingTimer,
        RetrySummary,
        TimerSpec,
        TimerStatus,
    )
    from timers.producer.async_client import AsyncTimers
    from timers.producer.client import Timers
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
    "UnknownFormat",
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

__version__ = "0.2.0"


_LAZY: dict[str, str] = {
    "aio": "timers.aio",
    "AsyncTimers": "timers.producer.async_client",
    "Backoff": "timers.model.policy",
    "Failure": "timers.ops.operations",
    "Fired": "timers.model.runs",
    "Listener": "timers.listener",
    "PendingTimer": "timers.ops.pending",
    "Rate": "timers.model.flow.rates",
    "Recurrence": "timers.model.cron",
    "RetrySummary": "timers.ops.operations",
    "Stats": "timers.ops.listings",
    "TaskPolicy": "timers.model.policy",
    "TimerContext": "timers.listener.calling.context",
    "TimerSpec": "timers.ops.operations",
    "TimerStatus": "timers.ops.status",
    "HistoryRecord": "timers.model.history",
    "MinuteStats": "timers.model.history",
    "TimerState": "timers.model.history",
    "Timers": "timers.producer.client",
    "current": "timers.listener.calling.context",
    "registered": "timers.model.policy",
    "task": "timers.model.policy",
    "EvictionWarning": "timers.store.eviction",
}
"""The public names imported on first use, and the module each comes from."""


_OPERATIONS = frozenset({"schedule", "schedule_many", "reschedule", "cancel", "get", "status",
                         "history", "series", "tasks_seen", "every", "unschedule_recurring",
                         "pause", "resume"})
"""The module-level functions: each is the [`Timers`][timers.producer.client.Timers] method of the
same name, called on the default instance (`timers.producer.forward.on_default`), made on first
use."""


def __getattr__(name: str) -> Any:
    """A name of `_LAZY` or `_OPERATIONS`, made on its first use (see the module
    docstring)."""
    value: Any
    if name in _OPERATIONS:
        from timers.producer.client import Timers
        from timers.producer.forward import on_default

        value = on_default(getattr(Timers, name), _instance, __name__)
    else:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'timers' has no attribute {name!r}")
        loaded = importlib.import_module(module)
        value = loaded if name == "aio" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_OPERATIONS})


_default: Timers | None = None
_default_lock = threading.Lock()
_pinned = False
"""True while a [`timers.testing.TimersTest`][timers.testing.TimersTest] is active:
[`configure`][timers.configure] (an app factory run by a test) leaves its in-memory server in
place."""


def configure(url: str | redis.Redis | None = None, **options: Any) -> Timers:
    """Set the default instance the module-level functions use: ``url`` is a URL, a
    ``redis.Redis`` the app manages (not closed by timers), or None for
    ``$TIMERS_REDIS_URL``; ``options`` as for [`Timers`][timers.producer.client.Timers] (``prefix=``
    …)."""
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


if typing.TYPE_CHECKING:  # what __getattr__ makes on first use, as type checkers see it
    from timers.producer.forward import on_default

    schedule = on_default(Timers.schedule, _instance, __name__)
    schedule_many = on_default(Timers.schedule_many, _instance, __name__)
    reschedule = on_default(Timers.reschedule, _instance, __name__)
    cancel = on_default(Timers.cancel, _instance, __name__)
    get = on_default(Timers.get, _instance, __name__)
    status = on_default(Timers.status, _instance, __name__)
    history = on_default(Timers.history, _instance, __name__)
    series = on_default(Timers.series, _instance, __name__)
    tasks_seen = on_default(Timers.tasks_seen, _instance, __name__)
    every = on_default(Timers.every, _instance, __name__)
    unschedule_recurring = on_default(Timers.unschedule_recurring, _instance, __name__)
    pause = on_default(Timers.pause, _instance, __name__)
    resume = on_default(Timers.resume, _instance, __name__)
