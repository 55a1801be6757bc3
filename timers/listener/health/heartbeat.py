"""A lane's heartbeat: says the listener is alive (or gone) in the lane's shard, with the
task list as :class:`~timers.listener.health.peers.Peers` tracks it; with several shards,
learns from the live listeners it reads back whether this one sweeps the shard first
(:func:`sweep_defer_ms`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sized
from typing import Any, Protocol

from timers.listener.calling.loader import TaskLoader
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.health.peers import Peers
from timers.listener.supervision.recycling import Recycler
from timers.model.encoding import as_text
from timers.model.wire import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
from timers.ops.fleet import encode_task_set
from timers.store.scripts import Scripts

BACKUP_SWEEP_MS = 20.0
"""How long after a due time a listener sweeps a shard another live listener sweeps first
(the one it would have done is late, stopped or dead)."""
HEARTBEAT_TTL_MS = round(HEARTBEAT_INTERVAL * HEARTBEAT_MISSES * 1000)
"""How long a heartbeat says the listener is alive (a few missed beats)."""


class ListenerView(Protocol):
    """What a heartbeat reads of its listener (:class:`timers.listener.shared.Shared`)."""

    @property
    def id(self) -> str:
        ...

    @property
    def peers(self) -> Peers:
        ...

    @property
    def loader(self) -> TaskLoader:
        ...

    @property
    def recycler(self) -> Recycler:
        ...

    @property
    def lanes(self) -> Sized:
        ...

    def describe(self) -> dict[str, Any]:
        ...


class Heartbeat:
    """The heartbeat of the lane of shard ``index``, sent with its ``scripts``.
    ``announces``: it carries the listener's task list as :class:`Peers` tracks it (the
    listener's only lane; with several shards, each lane sends the list with every
    heartbeat). ``tracker``: the lane's, told how long after a due time it sweeps."""

    def __init__(self, listener: ListenerView, scripts: Scripts, tracker: DueTracker,
                 index: int, *, announces: bool) -> None:
        self.listener, self.scripts, self.tracker = listener, scripts, tracker
        self.index, self.announces = index, announces
        self.task_list_sent = False  # this lane's heartbeat stored the task list

    async def beat(self, alive: bool) -> None:
        """Say the listener is alive (or gone) in this lane's shard; with several shards,
        learn whether it sweeps this one first."""
        listener = self.listener
        info = json.dumps(listener.describe()) if alive else ""
        peers = listener.peers
        digest, task_list = peers.announcement() if alive else ("", "")
        if alive and not self.task_list_sent:
            task_list = task_list or encode_task_set(listener.loader.task_names())
        stored, *live = await self.scripts.heartbeat(listener.id, HEARTBEAT_TTL_MS, info,
                                                     digest, task_list)
        if alive:
            if task_list:
                self.task_list_sent = True
                if self.announces:
                    peers.announced()
            listener.recycler.published()
            if self.announces and not int(stored):
                peers.gone_from_server()
            if len(listener.lanes) > 1:
                self.tracker.defer_ms = sweep_defer_ms(live, self.index, listener.id)


def sweep_defer_ms(live: Iterable[Any], shard: int, me: str) -> float:
    """0 if ``me`` is the first sweeper of shard number ``shard`` among the ``live``
    listener ids, else :data:`BACKUP_SWEEP_MS`. Shard ``i`` goes to the ``i``-th live id in
    sorted order, round the list, so the shards (and the work) spread evenly over the
    listeners; every listener sweeps every shard, the others later."""
    ids = sorted({as_text(i) for i in live or []} | {me})
    return 0.0 if ids[shard % len(ids)] == me else BACKUP_SWEEP_MS
