"""A listener's lanes: one per shard of the prefix (see :mod:`timers.shards`).

Every listener serves every shard, with no leader: a lane has the shard's own claims and
due-driven sweep, event subscription (on the node that holds the shard, since a cluster's
``expired`` events are node-local), wake channel, endings, leases, near keys and heartbeat.
The lanes of a listener share one runner (``--concurrency`` counts the runs of every lane),
the tasks, the stop and abort flags and the tally. With one shard the listener is its own
only lane, as it always was.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis.exceptions

from timers.cluster import is_cluster
from timers.encoding import as_text
from timers.exceptions import ShardLayoutMismatch
from timers.listener.due_tracker import DueTracker
from timers.listener.event_hub import EventHub
from timers.listener.retrying import RETRYABLE, ReconnectDelays, pause
from timers.scripts import Scripts
from timers.shards import ShardLayout, resolve_layout, wanted_count

if TYPE_CHECKING:
    from timers.keys import Keyspace
    from timers.listener.lifecycle import Listener

log = logging.getLogger("timers.listener")

BACKUP_SWEEP_MS = 20.0
"""How long after a due time a listener sweeps a shard another live listener sweeps first
(the one it would have done is late, stopped or dead)."""


async def read_layout(root: Listener) -> ShardLayout | None:
    """The prefix's layout, fixed now if this is its first use; tried until Redis answers
    (None: the listener was stopped first). A layout other than ``shards`` asked for is
    an error (:class:`timers.shards.ShardLayoutMismatch`)."""
    wanted, store = wanted_count(is_cluster(root.redis), root.shards)
    call = root._scripts.calls.shards(wanted, store)
    delays, told = ReconnectDelays(), False
    while not root._stopping.is_set():
        try:
            reply = await root._scripts.run(call)
        except RETRYABLE as exc:
            if isinstance(exc, redis.exceptions.ResponseError) and "timers shards" in str(exc):
                # a garbled stored count: no retry mends it
                raise ShardLayoutMismatch(str(exc).removeprefix("timers shards: ")) from None
            if not told:
                log.warning("cannot read the prefix's shard layout yet (%s); will keep "
                            "trying", exc)
                told = True
            await pause(delays.next(), root._stopping)
            continue
        return resolve_layout(root.keys, root.prefix, root.shards, reply)
    return None


def lanes_of(root: Listener, layout: ShardLayout) -> list[Listener]:
    """The listener's lanes for ``layout``: the listener itself for one shard."""
    if layout.count == 1:
        return [root]
    lanes = [_lane(root, keys, index) for index, keys in enumerate(layout.keyspaces)]
    lanes[0].events.subscribed = root.events.subscribed  # what `Listener.subscribed` gives
    hub = EventHub([lane.events for lane in lanes])
    for lane in lanes:
        lane.events.hub, lane.flow.shards = hub, len(lanes)
    return lanes


def _lane(root: Listener, keys: Keyspace, index: int) -> Listener:
    lane = copy.copy(root)  # shares the runner, loader, tally, recycler, flags, lanes list
    lane.keys, lane.shard_index = keys, index
    lane._scripts = Scripts(root.redis, keys)
    lane.tracker = DueTracker(root.clock, max_sleep=root.tracker.max_sleep)
    lane._new_lane_state()
    lane._wire_parts()
    return lane


def shard_note(lanes: list[Listener]) -> str:
    """For the start-up line: ``" over 16 shards"`` when there are several."""
    return f" over {len(lanes)} shards" if len(lanes) > 1 else ""


def sweep_defer_ms(live: Iterable[Any], shard: int, me: str) -> float:
    """0 if ``me`` is the first sweeper of shard number ``shard`` among the ``live``
    listener ids, else :data:`BACKUP_SWEEP_MS`. Shard ``i`` goes to the ``i``-th live id in
    sorted order, round the list, so the shards (and the work) spread evenly over the
    listeners; every listener sweeps every shard, the others later."""
    ids = sorted({as_text(i) for i in live or []} | {me})
    return 0.0 if ids[shard % len(ids)] == me else BACKUP_SWEEP_MS
