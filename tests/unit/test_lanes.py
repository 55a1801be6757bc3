"""A listener's lanes over shards: who sweeps a shard first, and one subscription per node
handing each message to the lane it names."""

from __future__ import annotations

from collections import Counter
from typing import Any

from timers.listener.finding.events import Channels, EventHub
from timers.listener.lanes import BACKUP_SWEEP_MS, sweep_defer_ms
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
