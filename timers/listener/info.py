"""A listener's heartbeat: what ``timers listeners`` shows of it (the JSON), and what it
learns back (the live listeners, who sweep its shard first)."""

from __future__ import annotations

import json
import os
import socket
from typing import TYPE_CHECKING, Any

from timers.fleet import encode_task_set
from timers.listener.lanes import sweep_defer_ms
from timers.wire import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES

if TYPE_CHECKING:
    from timers.listener.lifecycle import Listener


def describe(listener: Listener) -> dict[str, Any]:
    """The listener as a whole (every lane heartbeats the same, in its own shard)."""
    root = listener._root
    return {"id": root.id, "host": socket.gethostname(), "pid": os.getpid(),
            "started": round(root.started_at), "running": root._running_count(),
            "fired": root.ended_count, "concurrency": root.concurrency,
            "tasks": root.loader.package, "stuck": root._runner.stuck,
            "groups": root.groups, "task_set": root.peers.digest,
            **root.tally.recent.summary(),
            **root.recycler.heartbeat_info(root._stopping.is_set())}


async def heartbeat(listener: Listener, alive: bool) -> None:
    """Say the listener is alive (or gone) in its lane's shard; with several shards, learn
    whether it sweeps this one first."""
    info = json.dumps(describe(listener)) if alive else ""
    peers = listener._root.peers
    digest, task_list = peers.announcement() if alive else ("", "")
    if alive and not listener.task_list_sent:
        task_list = task_list or _task_list(listener)
    live = await listener._scripts.heartbeat(
        listener.id, round(HEARTBEAT_INTERVAL * HEARTBEAT_MISSES * 1000), info, digest,
        task_list)
    if alive:
        if task_list:
            listener.task_list_sent = True
            if listener is listener._root:
                peers.announced()
        listener.recycler.published()
        if listener is listener._root and not task_list:
            await peers.check_stored()
        if len(listener._lanes) > 1:
            listener.tracker.defer_ms = sweep_defer_ms(live, listener.shard_index, listener.id)


def _task_list(listener: Listener) -> str:
    return encode_task_set(listener._root.loader.task_names())
