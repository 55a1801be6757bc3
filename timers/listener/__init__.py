"""The listener package: finds due timers, claims them, runs them, records how they ended.

``from timers.listener import Listener`` loads the listener on first use, so importing a
helper module of this package (``timers.store.permissions`` …) stays light.
See :mod:`timers.listener.lifecycle` for how the parts fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timers.listener.defaults import (
        DEFAULT_CONCURRENCY,
        DEFAULT_FAILURE_RETENTION,
        DEFAULT_LEASE,
    )
    from timers.listener.lifecycle import Listener
    from timers.listener.supervision.recycling import RecycleLimits
    from timers.model.wire import HEARTBEAT_INTERVAL

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_FAILURE_RETENTION", "DEFAULT_LEASE",
           "HEARTBEAT_INTERVAL", "Listener", "RecycleLimits"]


def __getattr__(name: str) -> Any:
    if name == "RecycleLimits":
        from timers.listener.supervision.recycling import RecycleLimits

        return RecycleLimits
    if name in ("DEFAULT_CONCURRENCY", "DEFAULT_FAILURE_RETENTION", "DEFAULT_LEASE"):
        from timers.listener import defaults

        return getattr(defaults, name)
    if name == "HEARTBEAT_INTERVAL":
        from timers.model.wire import HEARTBEAT_INTERVAL

        return HEARTBEAT_INTERVAL
    if name in __all__:
        from timers.listener import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module 'timers.listener' has no attribute {name!r}")
