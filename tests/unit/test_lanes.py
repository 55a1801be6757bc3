"""A listener's lanes over shards: who sweeps a shard first, and one subscription per node
handing each message to the lane it names."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import fakeredis
import pytest

from timers.listener.finding import events
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.finding.events import Channels, EventHub, EventSource
from timers.listener.health.heartbeat import BACKUP_SWEEP_MS, sweep_defer_ms
from timers.listener.retrying import Outage
from timers.model.clock import ManualClock
from timers.model.encoding import Record, entry_text
from timers.model.keys import Keyspace


def firsts(live: list[str], shards: int) -> list[str]:
    """Each shard's first sweeper among ``live``."""
    return [next(i for i in live if sweep_defer_ms(live, shard, i) == 0.0)
            for shard in range(shards)]


def test_each_shard_has_exactly_one_first_sweeper_and_the_shards_spread_evenly() -> None:
    live = ["c:3:z", "a:1:x", "b:2:y"]
    for shard in range(6):
        defers = [sweep_defer_ms(live, shard, me) for me in live]
        assert sorted(defers) == [0.0, BACKUP_SWEEP_MS, BACKUP_SWEEP_MS]
    assert Counter(firsts(live, 6)) == {"a:1:x": 2, "b:2:y": 2, "c:3:z": 2}


def test_when_a_listener_leaves_the_others_share_its_shards() -> None:
    assert Counter(firsts(["a", "b", "d"], 6)) == {"a": 2, "b": 2, "d": 2}
    assert firsts(["a", "b", "c", "d"], 3) == ["a", "b", "c"]  # d: a backup everywhere


def test_a_listener_alone_or_not_yet_heard_sweeps_every_shard_first() -> None:
    assert all(sweep_defer_ms([], s, "me") == 0.0 for s in range(6))
    assert all(sweep_defer_ms([b"me"], s, "me") == 0.0 for s in range(6))
    assert sweep_defer_ms([b"other"], 0, "me") == 0.0  # a heartbeat read: "me" counts too
    assert sweep_defer_ms([b"other"], 1, "me") == BACKUP_SWEEP_MS


class Source:
    """What the hub needs of a lane's event source."""

    def __init__(self, prefix: str, node: str | None) -> None:
        self.channels = Channels.of(Keyspace(prefix), 0)
        self.node = node
        self.seen: list[Any] = []

    def holder(self) -> str | None:
        return self.node

    def handle(self, message: Any) -> None:
        self.seen.append(message["data"])


def test_the_first_lane_of_each_node_subscribes_for_its_group() -> None:
    lanes = [Source("{t#0.1}", "n1"), Source("{t#1.1}", "n2"), Source("{t#2.1}", "n1")]
    hub = EventHub(lanes)
    assert hub.channels_for(lanes[0]) == (b"__keyevent@0__:expired", b"{t#0.1}|wake",
                                          b"{t#2.1}|wake")
    assert hub.channels_for(lanes[1]) == (b"__keyevent@0__:expired", b"{t#1.1}|wake")
    assert hub.channels_for(lanes[2]) == ()
    lanes[2].node = "n3"  # its slot moved: it listens for itself now
    assert hub.channels_for(lanes[2]) == (b"__keyevent@0__:expired", b"{t#2.1}|wake")


def test_each_message_goes_to_the_lane_it_names_and_no_other() -> None:
    lanes = [Source("{t#0.1}", None), Source("{t#1.1}", None)]
    hub = EventHub(lanes)
    expired = b"__keyevent@0__:expired"
    for data in (b"{t#1.1}:abc:x.y:[1]", b"{t#0.1}:def:x.y:[2]", b"other:key", b"{t#9.1}:z:a:b",
                 b"nocolon"):
        hub.dispatch({"type": "message", "channel": expired, "data": data})
    hub.dispatch({"type": "message", "channel": b"{t#1.1}|wake", "data": b"123"})
    assert lanes[0].seen == [b"{t#0.1}:def:x.y:[2]"]
    assert lanes[1].seen == [b"{t#1.1}:abc:x.y:[1]", b"123"]
    assert Counter(len(s.seen) for s in lanes) == Counter({1: 1, 2: 1})


class Subscription:
    """A subscription that hands out ``messages``, then stops its reader."""

    connection = None  # (no hiredis reader: every message comes through get_message)

    def __init__(self, messages: list[dict[str, Any]], stopping: asyncio.Event) -> None:
        self.messages, self.stopping = messages, stopping

    async def get_message(self, **_: float) -> dict[str, Any] | None:
        if not self.messages:
            self.stopping.set()
            return None
        return self.messages.pop(0)


def test_a_lanes_subscription_hands_each_timer_to_its_lane_and_a_lane_alone_keeps_its_own(
) -> None:
    def expired(prefix: str, timer_id: str) -> dict[str, Any]:
        key = f"{prefix}:{entry_text(timer_id, Record('mod.add', [1]).encode())}"
        return {"type": "message", "pattern": None, "channel": b"__keyevent@0__:expired",
                "data": key.encode()}

    async def read(prefixes: list[str], messages: list[dict[str, Any]]) -> list[list[str]]:
        stopping, hub = asyncio.Event(), EventHub()
        sources = [EventSource(fakeredis.FakeAsyncRedis(), Channels.of(Keyspace(p), 0),
                               Keyspace(p), lambda task: None, DueTracker(ManualClock()),
                               lambda: None, lambda rejected: None, stopping,
                               outage=Outage(), hub=hub) for p in prefixes]
        first = sources[0]
        await first._read(Subscription(messages, stopping), None, hub.channels_for(first))
        return [source.take(10) for source in sources]

    shards = ["{t#0.1}", "{t#1.1}"]
    assert asyncio.run(read(shards, [expired(shards[1], "a"), expired(shards[0], "b"),
                                     expired("other", "c")])) == [["b"], ["a"]]
    assert asyncio.run(read(["timers"], [expired("timers", "d"), expired("other", "e")])
                       ) == [["d"]]


def test_once_subscribed_every_lane_of_the_group_sweeps() -> None:
    """Events may have been lost while nobody listened: each lane the subscription is for
    sweeps (the lanes of one node: here, one server)."""
    async def scenario() -> list[str]:
        stopping, hub, server = asyncio.Event(), EventHub(), fakeredis.FakeServer()
        pokes: list[str] = []
        sources = [EventSource(fakeredis.FakeAsyncRedis(server=server),
                               Channels.of(Keyspace(p), 0), Keyspace(p), lambda task: None,
                               DueTracker(ManualClock()), lambda p=p: pokes.append(p),
                               lambda rejected: None, stopping, outage=Outage(), hub=hub)
                   for p in ("{t#0.1}", "{t#1.1}")]
        running = asyncio.create_task(sources[0].run())
        await asyncio.wait_for(sources[0].subscribed.wait(), 5)
        stopping.set()
        await asyncio.wait_for(running, 5)
        return pokes

    assert asyncio.run(scenario()) == ["{t#0.1}", "{t#1.1}"]


class OnNode(EventSource):
    """A lane's source whose shard's node is :attr:`node` (a cluster's, as the test says)."""

    node = "n1"

    def holder(self) -> str | None:
        return self.node


def test_a_reader_subscribes_anew_when_a_shard_leaves_its_nodes_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster a lane's shard may move to another node (a failover, a migration): the
    lane that subscribes for the group it was in stops reading, so that the subscriptions
    are made again for the groups as they are now (the moved lane's wake channel on its new
    node's)."""
    monkeypatch.setattr(events, "is_cluster", lambda client: True)

    async def read(move: bool) -> int:
        stopping, hub = asyncio.Event(), EventHub()
        sources = [OnNode(fakeredis.FakeAsyncRedis(), Channels.of(Keyspace(p), 0),
                          Keyspace(p), lambda task: None, DueTracker(ManualClock()),
                          lambda: None, lambda rejected: None, stopping, outage=Outage(),
                          hub=hub) for p in ("{t#0.1}", "{t#1.1}")]
        channels = hub.channels_for(sources[0])
        assert sources[1].channels.wake in channels
        if move:
            sources[1].node = "n2"
        messages = [{"type": "message", "pattern": None, "channel": b"__keyevent@0__:expired",
                     "data": b"other:key"} for _ in range(3)]
        await sources[0]._read(Subscription(messages, stopping), "n1", channels)
        return len(messages)  # left unread

    assert asyncio.run(read(move=False)) == 0
    assert asyncio.run(read(move=True)) == 3
