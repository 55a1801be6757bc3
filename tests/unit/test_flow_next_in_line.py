"""The run next in line on a concurrency key slot (fakeredis + lupa): handed along with a
run that holds the slot, it takes the slot over when that run's ending is written; handed
back, recovered or left behind by a dead listener, it never holds a slot it should not."""

from __future__ import annotations

import fakeredis
import pytest

from tests.unit.flow_helpers import KS, LEASE, add, claim, gate, ids, s
from timers import Timers
from timers.model.runs import Run
from timers.store.script_calls import ScriptCalls
from timers.store.script_rows import NewTimer, ParkTimer, Taker
from timers.store.scripts import Scripts

__all__ = ["s"]  # the fixture

NEXT_KEY = KS.next_in_line


def end(s: Scripts, *endings: tuple[str, str, str, str], follow: bool = True,
        take: int = 1, groups: tuple[str, ...] = ("default",)) -> list[Run]:
    """Write endings as a listener that takes handed runs; the runs it is handed."""
    reply = s.finish(retention_ms=1000, endings=list(endings),
                     taker=Taker("me", groups, take, LEASE, follow))
    items = reply[1:]
    return [Run.parse(*items[i:i + 3]) for i in range(0, len(items), 3)]


def ok(run: Run) -> tuple[str, str, str, str]:
    return (run.token, "ok", "", "")


def key_of_four(s: Scripts, records: tuple[str, ...] = ("t.f:",) * 4) -> list[Run]:
    """a holds key k; b, c, d wait for it, in that order."""
    for i, (name, record) in enumerate(zip("abcd", records, strict=True)):
        add(s, name, record, -40 + i)
    runs = claim(s)
    assert gate(s, runs, key="k", limit=1) == ["go", "wait", "wait", "wait"]
    return runs


def slot_holders(fake: fakeredis.FakeRedis) -> list[bytes]:
    return fake.zrange(KS.slots("k"), 0, -1)


def test_a_handed_run_brings_the_next_timer_as_the_run_next_in_line_after_it(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    handed, following = end(s, ok(a))
    assert (handed.timer_id, handed.source, handed.follows) == ("b", "handoff", "")
    assert (following.timer_id, following.source) == ("c", "next")
    assert following.follows == handed.token
    # c holds no slot yet, is no longer waiting, and nobody else can claim it
    assert slot_holders(fake) == [handed.token.encode()]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"d"]
    assert fake.hget(NEXT_KEY, handed.token) == following.token.encode()
    assert claim(s) == [] and fake.zcard(KS.running) == 2


def test_the_ending_of_the_run_before_passes_its_slot_on_and_brings_the_one_after(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    [d] = end(s, ok(b))
    assert slot_holders(fake) == [c.token.encode()]
    assert (d.timer_id, d.source, d.follows) == ("d", "next", c.token)
    assert fake.hget(KS.held, c.token) is not None and fake.hget(KS.held, b.token) is None
    assert fake.zcard(KS.due) == 0 and claim(s) == []
    assert end(s, ok(c)) == []  # nothing waits any more
    assert slot_holders(fake) == [d.token.encode()]
    end(s, ok(d))
    assert slot_holders(fake) == [] and fake.hlen(NEXT_KEY) == 0
    assert fake.hget(KS.stats, "fired") == b"4"


def test_a_listener_that_takes_no_runs_next_in_line_is_handed_none(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    assert ids(end(s, ok(a), follow=False)) == ["b"]
    assert fake.zcard(KS.key_queue("k")) == 2 and fake.hlen(NEXT_KEY) == 0


def test_a_run_next_in_line_handed_back_waits_again_in_its_place(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    assert end(s, (c.token, "release", "", "")) == []  # holds no slot: frees none
    assert slot_holders(fake) == [b.token.encode()]
    [again] = claim(s)  # due again at once, and the gate puts it back before d
    assert again.timer_id == "c" and gate(s, [again], key="k", limit=1) == ["wait"]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c", b"d"]
    handed, following = end(s, ok(b))  # b's slot goes to the head, not to c's old token
    assert ids([handed, following]) == ["c", "d"]
    assert slot_holders(fake) == [handed.token.encode()]


def test_a_run_next_in_line_handed_back_naming_the_run_before_it_goes_back_in_its_place(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """A run next in line handed back unstarted names the run it follows (its listener
    stopped, or the run before it was not started): it goes back into its key's queue
    ahead of the timers behind it, the run before it keeps its slot and follows nobody,
    and every key it touched was declared (the key is the task's: no ``;k=``)."""
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    assert fake.hget(NEXT_KEY, b.token) == c.token.encode()
    assert end(s, (c.token, "release", "", b.token)) == []
    assert fake.hlen(NEXT_KEY) == 0 and slot_holders(fake) == [b.token.encode()]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c", b"d"]
    assert fake.hget(KS.stats, "handed_back") == b"1"
    handed, following = end(s, ok(b))
    assert ids([handed, following]) == ["c", "d"]


def test_a_dead_listeners_run_next_in_line_gets_no_slot_and_both_run_again_in_order(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    for token in (b.token, c.token):  # the listener died: both leases lapse
        fake.zadd(KS.running, {token: 1})
    fake.zadd(KS.slots("k"), {b.token: 1})
    runs = claim(s)
    # b's slot passed to b's rerun (the cut command goes first); c, handed to the dead
    # listener (which may have started it in b's thread as b returned), went back into
    # the key's queue as a rerun, in its place: it runs again after b, d still behind it
    assert ids(runs) == ["b"] and fake.hlen(NEXT_KEY) == 0
    assert [run.source for run in runs] == ["recovered"]
    assert gate(s, runs, key="k", limit=1) == ["go"]
    assert slot_holders(fake) == [runs[0].token.encode()]
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c", b"d"]
    assert b";rc=1" in fake.hget(KS.records, "c") and fake.zcard(KS.running) == 1
    assert fake.hget(KS.stats, "reruns") == b"2", "b and c each counted as a rerun"
    again = end(s, ok(runs[0]))  # b's rerun ends: c is handed over, d next in line
    assert ids(again) == ["c", "d"] and again[0].reruns == 1 and again[1].reruns == 0


def test_a_run_handed_back_with_a_grace_keeps_its_slot_and_its_next_in_line_its_place(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    end(s, (b.token, "release", "1000", ""), (c.token, "release", "1000", b.token))
    assert slot_holders(fake) == [b"w:b"] and fake.hlen(NEXT_KEY) == 0
    # c went back into the key's queue in its place, d behind it; b comes due in 1 s
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c", b"d"] and claim(s) == []


def test_a_run_handed_back_unstarted_keeps_its_slot_and_its_next_in_line_its_place(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """T17 without a grace (a stopping listener hands back a run handed over holding the
    key's slot, and the run next in line after it): the slot is kept for the first, the
    second waits in the key's queue in its place, and the key's later timer stays
    behind both (before, the slot went to the queue's head and both went back to the due
    index behind it)."""
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    end(s, (c.token, "release", "", b.token), (b.token, "release", "", ""))
    assert slot_holders(fake) == [b"w:b"] and fake.hlen(NEXT_KEY) == 0
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c", b"d"]
    runs = claim(s)
    assert ids(runs) == ["b"] and gate(s, runs, key="k", limit=1) == ["go"]
    handed, following = end(s, ok(runs[0]))
    assert ids([handed, following]) == ["c", "d"]


def test_a_run_next_in_line_goes_back_behind_a_holder_held_for_its_rate(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """The rate-wait FIFO rule: b, held back for its rate, keeps its place in its key's
    order, and c, next in line after it, goes back into the key's queue in its place (its
    run dropped: its listener does not start it) instead of taking the slot past b (before:
    the slot passed to c)."""
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    fake.hset(KS.rate("r"), "tat", 10**15)  # the rate limit is spent far ahead
    assert gate(s, [b], key="k", limit=1, rate="r", interval_ms=1000, burst=1) == ["wait"]
    assert slot_holders(fake) == [] and fake.hlen(NEXT_KEY) == 0
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c", b"d"]
    assert fake.hget(KS.parked, "c").startswith(b"c|1|")
    assert fake.zcard(KS.running) == 0 and fake.hexists(KS.records, "c")
    assert gate(s, [c], key="k", limit=1) == ["lost"]
    assert claim(s) == []  # b waits for its rate, c and d behind it for the key


def test_no_run_next_in_line_of_a_group_the_listener_does_not_serve(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    records = ("t.f:", "t.f:", "t.f;g=video:", "t.f:")
    for i, (name, record) in enumerate(zip("abcd", records, strict=True)):
        add(s, name, record, -40 + i)
    runs = claim(s) + claim(s, groups=("video",))
    assert sorted(gate(s, runs, key="k", limit=1)) == ["go", "wait", "wait", "wait"]
    a = next(run for run in runs if run.timer_id == "a")
    assert ids(end(s, ok(a))) == ["b"]  # c, a video timer, is the head: none next in line
    assert fake.hlen(NEXT_KEY) == 0


def test_the_run_next_in_line_is_the_head_by_priority(s: Scripts) -> None:
    a, _, _, _ = key_of_four(s)
    add(s, "e", "t.f;p=5:", -1)
    assert gate(s, claim(s), key="k", limit=1) == ["wait"]
    handed, following = end(s, ok(a))
    assert ids([handed, following]) == ["e", "b"]


@pytest.mark.parametrize("follow", ["", "2", "yes"])
def test_a_bad_follow_argument_is_refused(s: Scripts, fake: fakeredis.FakeRedis,
                                          follow: str) -> None:
    a, _, _, _ = key_of_four(s)
    args = [KS.timer_key_start, KS.wake_channel, 1000, "me", "default", 1, LEASE, follow,
            0, 0, 8, 0, a.token, "ok", "", "", "", ""]
    keys = list(ScriptCalls(KS).finish(retention_ms=1000, endings=[]).keys)
    with pytest.raises(Exception, match="bad arguments"):
        s.script("finish")(keys=keys, args=args)
    assert slot_holders(fake) == [a.token.encode()]


def test_a_timer_that_outranks_the_run_next_in_line_goes_right_after_it(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """The FIFO rule at each giving of the key's slot: c was handed next in line after b
    (T13) before "high" and "parked" came to wait ahead of d, so c keeps its turn (nothing
    asks it back) and they go right after it, by priority, before every other waiting
    timer of the key."""
    a, _, _, _ = key_of_four(s)
    b, c = end(s, ok(a))
    add(s, "late", "t.f:", -1)  # due after d, same priority: behind it
    assert gate(s, claim(s), key="k", limit=1) == ["wait"]
    add(s, "high", "t.f;p=5:", -1)
    assert gate(s, claim(s), key="k", limit=1) == ["wait"]
    add(s, "parked", "t.f;p=7:", -1)  # parked straight from the due index (a backlog)
    assert s.park(LEASE, [ParkTimer("parked", "t.f;p=7:", "k", 1)]) == 1
    assert fake.hget(NEXT_KEY, b.token) == c.token.encode()
    started = ids([b, c])
    holder, following = b, c
    while handed := end(s, ok(holder)):  # each ending gives the slot on, and hands one
        [after] = handed
        assert after.follows == following.token and slot_holders(fake) == [
            following.token.encode()]
        started.append(after.timer_id)
        holder, following = following, after
    assert started == ["b", "c", "parked", "high", "d", "late"]


def test_no_run_next_in_line_past_an_earlier_timer_claimed_and_not_gated_yet(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    """T13's order barrier at the hand of a run next in line: x, due before c, was claimed
    by another listener and has not reached its gate, so c is not handed next in line
    after b (it would start before x): it waits in the key's queue, and x goes before it."""
    for name, due in (("a", -40), ("b", -30), ("c", -10)):
        add(s, name, "t.f:", due)
    runs = claim(s)
    assert gate(s, runs, key="k", limit=1) == ["go", "wait", "wait"]
    # due between b and c by their own due times (a due time "in" ms from now would move
    # past c's on a slow machine)
    s.schedule([NewTimer("x", "t.f:", "at", (runs[1].due_ms + runs[2].due_ms) // 2, "r")])
    reply = s.claim(limit=1, lease_ms=LEASE, horizon_ms=0, listener_id="other",
                    keyed_tasks=("t.f",))
    x = Run.parse(*reply[3:6])
    [b] = end(s, ok(runs[0]))  # b handed over, and c held back behind x
    assert b.timer_id == "b" and fake.hlen(NEXT_KEY) == 0
    assert fake.zrange(KS.key_queue("k"), 0, -1) == [b"c"]
    assert gate(s, [x], key="k", limit=1) == ["wait"]  # b holds the slot: x waits
    handed, following = end(s, ok(b))  # x goes first, and c is next in line after it
    assert ids([handed, following]) == ["x", "c"] and following.follows == handed.token


def test_stats_count_the_run_next_in_line_among_the_running_and_say_so(
        s: Scripts, fake: fakeredis.FakeRedis) -> None:
    a, _, _, _ = key_of_four(s)
    end(s, ok(a))
    with Timers(fake) as t:
        stats = t.stats()
    assert (stats.running, stats.next_in_line, stats.waiting_keys) == (2, 1, {"k": 1})
