"""``schedule.lua`` with several timers writes the new ones as a batch (one HMGET, one
HSET, one ZADD per due index) and the rest one by one: whatever the mix of new, pending,
repeated, grouped and prioritised ids, a call of many leaves exactly what one call per
timer, in the same order, leaves, and replies the same (fakeredis)."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
from hypothesis import given, settings
from hypothesis import strategies as st

from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.store.script_rows import NewTimer
from timers.store.scripts import Scripts

KS = Keyspace()
HOUR_MS = 3_600_000


def now_ms() -> int:
    """This machine's clock, which fakeredis's TIME reads: taken in each test, since the
    near horizon is measured from the call."""
    return int(time.time() * 1000)

RECORDS = ["a.b:[1]", "a.b:[2]", "a.b;g=g2:[1]", "a.b;p=5:[1]", "a.b;g=g2;p=-3:[2]",
           'a.b:["x;g=y"]']
"""Plain records, a group, a priority, both, and args that hold ';g=' (still plain)."""

# id, record, due in ms from now: due (no key), within the near horizon (a key), beyond
# it (none); how
timer = st.tuples(st.sampled_from(["t1", "t2", "t3", "t4"]), st.sampled_from(RECORDS),
                  st.sampled_from([-1000, 60_000, 2 * HOUR_MS]), st.sampled_from(["r", "n", "k"]))
Drawn = tuple[str, str, int, str]


def timers_at(drawn: list[Drawn], now: int) -> list[NewTimer]:
    return [NewTimer(tid, record, "at", now + offset, how) for tid, record, offset, how in drawn]


def state(fake: fakeredis.FakeRedis) -> dict[str, Any]:
    """Every key and its content (a string key by name: the expiring keys)."""
    out: dict[str, Any] = {}
    for raw in fake.keys("*"):
        key = as_text(raw)
        kind = as_text(fake.type(key))
        if kind == "hash":
            out[key] = fake.hgetall(key)
        elif kind == "zset":
            out[key] = fake.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = fake.smembers(key)
        else:
            out[key] = (kind, fake.pexpiretime(key) > 0 if kind == "string" else None)
    return out


@settings(max_examples=150, deadline=None)
@given(before=st.lists(timer, max_size=3), call=st.lists(timer, min_size=2, max_size=7))
def test_a_call_of_many_leaves_what_one_call_per_timer_leaves(
        before: list[Drawn], call: list[Drawn]) -> None:
    now = now_ms()
    batched, single = fakeredis.FakeRedis(), fakeredis.FakeRedis()
    for fake in (batched, single):
        for t in timers_at(before, now):
            Scripts(fake, KS).schedule([t])
    many = Scripts(batched, KS).schedule(timers_at(call, now))
    one_by_one = [Scripts(single, KS).schedule([t])[1] for t in timers_at(call, now)]
    assert many[1:] == one_by_one
    assert state(batched) == state(single)


def test_new_timers_with_a_repeated_id_and_a_pending_one_in_one_call() -> None:
    now = now_ms()
    fake = fakeredis.FakeRedis()
    scripts = Scripts(fake, KS)
    scripts.schedule([NewTimer("old", "a.b:[0]", "at", now + 60_000, "r")])
    reply = scripts.schedule([
        NewTimer("a", "a.b:[1]", "at", now + 60_000, "n"),
        NewTimer("old", "a.b:[9]", "at", now + 70_000, "n"),  # pending: refused
        NewTimer("a", "a.b:[1]", "at", now + 80_000, "n"),  # the same record: its due
        NewTimer("b", "a.b;g=g2;p=5:[2]", "at", now + 90_000, "n"),
        NewTimer("c", "a.b:[3]", "at", now + 60_000, "r"),
        NewTimer("c", "a.b:[4]", "at", now + 95_000, "r"),  # replaces the one before
    ])
    assert reply[1:] == [now + 60_000, None, now + 60_000, now + 90_000,
                         now + 60_000, now + 95_000]
    records = {as_text(k): as_text(v) for k, v in fake.hgetall(KS.records).items()}
    assert records == {"old": "a.b:[0]", "a": "a.b:[1]", "b": "a.b;g=g2;p=5:[2]",
                       "c": "a.b:[4]"}
    assert set(fake.zrange(KS.due, 0, -1)) == {b"old", b"a", b"c"}
    assert fake.zscore(KS.due, "c") == now + 95_000
    assert fake.zrange(f"{KS.due}|g2|5", 0, -1) == [b"b"]
    assert fake.smembers(KS.queues) == {b"g2|5"}
    assert not fake.exists(f"{KS.timer_key_start}c:a.b:[3]")
    assert fake.exists(f"{KS.timer_key_start}c:a.b:[4]")


def test_a_retried_call_of_a_grouped_timer_replies_its_due_time() -> None:
    """The same call sent again (its reply was lost): the timer's due time, read from the
    due index its record names, not a reply cut short."""
    now = now_ms()
    scripts = Scripts(fakeredis.FakeRedis(), KS)
    call = [NewTimer("g", "a.b;g=g2;p=5:[2]", "at", now + 90_000, "n"),
            NewTimer("h", "a.b:[1]", "at", now + 60_000, "n")]
    assert scripts.schedule(call)[1:] == [now + 90_000, now + 60_000]
    assert scripts.schedule(call)[1:] == [now + 90_000, now + 60_000]
    assert scripts.schedule(call[:1])[1:] == [now + 90_000]
