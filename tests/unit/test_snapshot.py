"""The keyspace snapshot behind metrics, top and the dashboard: its figures, and heartbeats
read in the types views expect whatever was written there."""

from __future__ import annotations

import json

import fakeredis

from timers import Timers, TimerSpec
from timers.ops.snapshot import SOON_MS, read_snapshot


def test_the_figures_count_what_is_pending_due_overdue_and_forged_beats_read_safely(
        fake: fakeredis.FakeRedis) -> None:
    t = Timers(fake)
    t.schedule_many([TimerSpec("a.b", [i], in_=30) for i in range(3)]
                    + [TimerSpec("a.b", [i], in_=7200, group="video", priority=5)
                       for i in range(2)]
                    + [TimerSpec("a.b", [i], in_=-10, group="nobody") for i in range(4)])
    fake.zadd("timers|listeners", {"forged": 2 ** 50})
    fake.hset("timers|listener", "forged", json.dumps(
        {"groups": 5, "running": "<i>", "busiest_tasks": [["x", "y"], ["mail", 3]]}))
    snap = t.run(read_snapshot(t.keys))
    assert snap.pending == 9 and snap.overdue == 4
    assert snap.pending_by_group() == {"default": 3, "nobody": 4, "video": 2}
    assert (snap.due_within(SOON_MS[0]), snap.due_within(SOON_MS[1])) == (3, 3)
    (beat,) = snap.listeners
    assert (beat["id"], beat["groups"], beat["running"], beat["busiest_tasks"]) == (
        "forged", [], None, [["mail", 3]])


def test_stats_and_listeners_read_past_a_forged_heartbeat(fake: fakeredis.FakeRedis) -> None:
    t = Timers(fake)
    fake.zadd("timers|listeners", {"a": 2 ** 50, "b": 2 ** 50})
    fake.hset("timers|listener", mapping={"a": json.dumps({"groups": 5, "started": "x"}),
                                          "b": json.dumps([1, 2])})
    assert t.stats().pending == 0
    assert t.listeners() == [{"groups": 5, "started": "x"}]
