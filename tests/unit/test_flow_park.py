"""park.lua (fakeredis + lupa): a due backlog with concurrency keys goes into the keys'
queues without being claimed, the head of each queue is promoted at once, and what a
claim and a gate do next is what they would have done with the timers held one by one."""

from __future__ import annotations

import fakeredis

from tests.unit.flow_helpers import KS, LEASE, add, claim, finish, gate, s
from timers.store.script_rows import ParkTimer
from timers.store.scripts import Scripts

__all__ = ["s"]  # the fixture


def peek(s: Scripts, limit: int = 100, groups: tuple[str, ...] = ("default",)) -> list[str]:
    reply = s.peek(limit, groups)
    return [x.decode() for x in reply[0::3]]


def park(s: Scripts, *timers: tuple[str, str, str, int]) -> int:
    return int(s.park(LEASE, [ParkTimer(*t) for t in timers]))


def test_peek_reads_due_timers_of_served_groups_highest_priority_first(s: Scripts) -> None:
    add(s, "a", "t.f:", -500)
    add(s, "b", "t.f;p=5:", -1)
    add(s, "later", "t.f:", 60_000)
    add(s, "vid", "t.f;g=video:", -1)
    assert peek(s) == ["b", "a"]
    assert peek(s, limit=1) == ["b"]
    assert peek(s, groups=("video",)) == ["vid"]


def test_a_backlog_is_queued_per_key_and_each_keys_head_goes_first(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    for i in range(5):
        add(s, f"k{i}", "t.f:", -100 + i)
    add(s, "j0", "t.f:", -50)
    assert park(s, *[(f"k{i}", "t.f:", "k", 1) for i in range(5)], ("j0", "t.f:", "j", 1)) == 6
    # the head of each key is promoted (ahead of every due timer, its slot kept) ...
    assert fake.zrange(KS.due, 0, -1, withscores=True) == [(b"j0", 0.0), (b"k0", 0.0)]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"k1", b"k2", b"k3", b"k4"]
    assert fake.zrange(KS.slots("k"), 0, -1) == [b"w:k0"]
    # ... and claimed and gated as any promoted timer: it goes, the rest wait their turn
    runs = {run.timer_id: run for run in claim(s)}
    assert sorted(runs) == ["j0", "k0"]
    assert gate(s, [runs["k0"]], key="k", limit=1) == ["go"]
    assert gate(s, [runs["j0"]], key="j", limit=1) == ["go"]
    assert ";w=" in runs["k0"].record_text  # its lateness counts from its own due time
    assert peek(s) == []  # the queued ones are not in the backlog any more
    finish(s, runs["k0"])
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"k2", b"k3", b"k4"]


def test_a_timer_changed_since_the_peek_or_not_due_or_held_already_is_left_alone(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "changed", "t.f:[2]", -10)
    add(s, "future", "t.f:", 60_000)
    add(s, "x", "t.f:", -10)
    assert park(s, ("x", "t.f:", "k", 1)) == 1  # x is now promoted, kept in the parked hash
    assert park(s, ("changed", "t.f:[1]", "k", 1), ("future", "t.f:", "k", 1),
                ("x", "t.f:", "k", 1)) == 0
    assert fake.zscore(KS.due, "changed") is not None
    assert fake.zscore(KS.due, "future") is not None
    assert fake.zcard(KS.key_queue("k")) == 0


def test_priority_orders_the_queue_and_picks_the_head(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "low", "t.f:", -500)
    add(s, "high", "t.f;p=7:", -1)
    add(s, "low2", "t.f:", -400)
    park(s, ("low", "t.f:", "k", 1), ("high", "t.f;p=7:", "k", 1), ("low2", "t.f:", "k", 1))
    assert fake.zrange(KS.slots("k"), 0, -1) == [b"w:high"]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"low", b"low2"]


def test_a_full_key_promotes_nothing(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "holder", "t.f:", -100)
    [run] = claim(s)
    assert gate(s, [run], key="k", limit=1) == ["go"]
    add(s, "next", "t.f:", -10)
    assert park(s, ("next", "t.f:", "k", 1)) == 1
    assert fake.zcard(KS.due) == 0
    finish(s, run)  # the slot frees: the next in line is promoted
    assert fake.zrange(KS.due, 0, -1) == [b"next"]


def test_bad_park_arguments_write_nothing(s: Scripts, fake: fakeredis.FakeRedis) -> None:
    add(s, "x", "t.f:", -10)
    before = fake.zrange(KS.due, 0, -1, withscores=True)
    for timers in ([("x", "t.f:", "", 1)], [("x", "t.f:", "k", 0)], [("", "t.f:", "k", 1)]):
        try:
            park(s, *timers)
        except Exception as exc:
            assert "bad timer" in str(exc)
        else:
            raise AssertionError(f"{timers} was accepted")
    assert fake.zrange(KS.due, 0, -1, withscores=True) == before
