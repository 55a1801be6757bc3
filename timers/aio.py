"""The asyncio twins of the module-level functions in :mod:`timers`.

>>> import timers.aio
>>> tid = await timers.aio.schedule("reminders.sms", {"user_id": 42}, in_=60)

They use a default :class:`AsyncTimers` made on first use from ``$TIMERS_REDIS_URL``
(see :func:`configure`); it belongs to the event loop that first used it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from timers.client import AsyncTimers
from timers.encoding import Args
from timers.operations import PendingTimer, TimerSpec

__all__ = ["cancel", "configure", "get", "reschedule", "schedule", "schedule_many"]

_default: AsyncTimers | None = None


def configure(url: str | None = None, **options: Any) -> AsyncTimers:
    """Set the default instance the functions below use."""
    global _default
    _default = AsyncTimers(url, **options)
    return _default


def _instance() -> AsyncTimers:
    global _default
    if _default is None:
        _default = AsyncTimers()
    return _default


async def schedule(
    task: str,
    args: Args | tuple[Any, ...] = None,
    *,
    in_: float | timedelta | None = None,
    at: datetime | None = None,
    id: str | None = None,
    max_lateness: float | timedelta | None = None,
) -> str:
    return await _instance().schedule(task, args, in_=in_, at=at, id=id,
                                      max_lateness=max_lateness)


async def schedule_many(specs: Iterable[TimerSpec | Mapping[str, Any]]) -> list[str]:
    return await _instance().schedule_many(specs)


async def reschedule(
    id: str, *, in_: float | timedelta | None = None, at: datetime | None = None
) -> bool:
    return await _instance().reschedule(id, in_=in_, at=at)


async def cancel(id: str) -> bool:
    return await _instance().cancel(id)


async def get(id: str) -> PendingTimer | None:
    return await _instance().get(id)
