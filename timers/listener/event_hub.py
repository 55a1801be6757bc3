"""One subscription per Redis node for a listener's lanes (see :mod:`timers.listener.lanes`).

Every lane of a listener would otherwise subscribe to the ``expired`` events of its shard's
node, and each message of a node would be read once per lane there (16 times over on one
server with 16 shards). Instead the lanes are grouped by the node that holds their shard;
the first lane of each group subscribes, for its group, to the node's ``expired`` events
and to the group's wake channels, and hands each message to the lane it names (by the
timer key's prefix, or the wake channel). The groups follow the cluster: a lane whose
shard moved (a failover, a migration) lands in another group, and the subscriptions of
the groups it left and joined are made again (see :meth:`EventSource.run`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timers.listener.events import EventSource


class EventHub:
    """Routes one node's messages to the lanes' event sources."""

    def __init__(self, sources: Sequence[EventSource]) -> None:
        self.sources = list(sources)
        self._by_start = {s.channels.timer_key_start: s for s in self.sources}
        self._by_wake = {s.channels.wake: s for s in self.sources}

    def group_of(self, source: EventSource) -> list[EventSource]:
        """The lanes whose shards are on the node ``source``'s shard is on (in lane order)."""
        mine = source.holder()
        return [s for s in self.sources if s is source or s.holder() == mine]

    def channels_for(self, source: EventSource) -> tuple[bytes, ...]:
        """What ``source`` subscribes to: nothing unless it is its group's first lane."""
        group = self.group_of(source)
        if group[0] is not source:
            return ()
        return (source.channels.expired, *(s.channels.wake for s in group))

    def dispatch(self, message: Mapping[str, Any]) -> None:
        """Hand ``message`` to the lane it concerns (none: another app's key, say)."""
        channel, data = message.get("channel"), message.get("data")
        target = self._by_wake.get(channel) if isinstance(channel, bytes) else None
        if target is None and isinstance(data, bytes):
            target = self._by_start.get(data[:data.find(b":") + 1])
        if target is not None:
            target.handle(message)
