"""What ``timers listeners`` shows of a listener: its heartbeat's JSON."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timers.listener.lifecycle import Listener


def describe(listener: Listener) -> dict[str, Any]:
    """The listener as a whole (every lane heartbeats the same, in its own shard)."""
    root = listener._root
    return {"id": root.id, "host": socket.gethostname(), "pid": os.getpid(),
            "started": round(root.started_at), "running": root._running_count(),
            "fired": root.ended_count, "concurrency": root.concurrency,
            "tasks": root.loader.package, "stuck": root._runner.stuck,
            "groups": root.groups, **root.tally.recent.summary(),
            **root.recycler.heartbeat_info(root._stopping.is_set())}
