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

from timers.model.keys import Keyspace
from timers.store.scripts import NewTimer, Scripts

KS = Keyspace()
NOW_MS = int(time.time() * 1000)
HOUR_MS = 3_600_000

RECORDS = ["a.b:[1]", "a.b:[2]", "a.b;g=g2:[1]", "a.b;p=5:[1]", "a.b;g=g2;p=-3:[2]",
           'a.b:["x;g=y"]']
"""Plain records, a group, a priority, both, and args that hold ';g=' (still plain)."""

timer = st.builds(NewTimer, st.sampled_from(["t1", "t2", "t3", "t4"]),
                  st.sampled_from(RECORDS), st.just("at"),
                  # due now (no key), within the near horizon (a key), beyond it (none)
                  st.sampled_from([NOW_MS - 1000, NOW_MS + 60_000, NOW_MS + 2 * HOUR_MS]),
                  st.sampled_from(["r", "n", "k"]))


def state(fake: fakeredis.FakeRedis) -> dict[str, Any]:
    """Every key and its content (a string key by name: the expiring keys)."""
    out: dict[str, Any] = {}
    for raw in fake.keys("*"):
        key = raw.decode()
        kind = fake.type(key).decode()
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
        before: list[NewTimer], call: list[NewTimer]) -> None:
    batched, single = fakeredis.FakeRedis(), fakeredis.FakeRedis()
    for fake in (batched, single):
        for t in before:
            Scripts(fake, KS).schedule([t])
    many = Scripts(batched, KS).schedule(call)
    one_by_one = [Scripts(single, KS).schedule([t])[1] for t in call]
    assert many[1:] == one_by_one
    assert state(batched) == state(single)


def test_new_timers_with_a_repeated_id_and_a_pending_one_in_one_call() -> None:
    fake = fakeredis.FakeRedis()
    scripts = Scripts(fake, KS)
    scripts.schedule([NewTimer("old", "a.b:[0]", "at", NOW_MS + 60_000, "r")])
    reply = scripts.schedule([
        NewTimer("a", "a.b:[1]", "at", NOW_MS + 60_000, "n"),
        NewTimer("old", "a.b:[9]", "at", NOW_MS + 70_000, "n"),  # pending: refused
        NewTimer("a", "a.b:[1]", "at", NOW_MS + 80_000, "n"),  # the same record: its due
        NewTimer("b", "a.b;g=g2;p=5:[2]", "at", NOW_MS + 90_000, "n"),
        NewTimer("c", "a.b:[3]", "at", NOW_MS + 60_000, "r"),
        NewTimer("c", "a.b:[4]", "at", NOW_MS + 95_000, "r"),  # replaces the one before
    ])
    assert reply[1:] == [NOW_MS + 60_000, None, NOW_MS + 60_000, NOW_MS + 90_000,
                         NOW_MS + 60_000, NOW_MS + 95_000]
    records = {k.decode(): v.decode() for k, v in fake.hgetall(KS.records).items()}
    assert records == {"old": "a.b:[0]", "a": "a.b:[1]", "b": "a.b;g=g2;p=5:[2]",
                       "c": "a.b:[4]"}
    assert set(fake.zrange(KS.due, 0, -1)) == {b"old", b"a", b"c"}
    assert fake.zscore(KS.due, "c") == NOW_MS + 95_000
    assert fake.zrange(f"{KS.due}|g2|5", 0, -1) == [b"b"]
    assert fake.smembers(KS.queues) == {b"g2|5"}
    assert not fake.exists(f"{KS.timer_key_start}c:a.b:[3]")
    assert fake.exists(f"{KS.timer_key_start}c:a.b:[4]")


def test_a_retried_call_of_a_grouped_timer_replies_its_due_time() -> None:
    """The same call sent again (its reply was lost): the timer's due time, read from the
    due index its record names, not a reply cut short."""
    scripts = Scripts(fakeredis.FakeRedis(), KS)
    call = [NewTimer("g", "a.b;g=g2;p=5:[2]", "at", NOW_MS + 90_000, "n"),
            NewTimer("h", "a.b:[1]", "at", NOW_MS + 60_000, "n")]
    assert scripts.schedule(call)[1:] == [NOW_MS + 90_000, NOW_MS + 60_000]
    assert scripts.schedule(call)[1:] == [NOW_MS + 90_000, NOW_MS + 60_000]
    assert scripts.schedule(call[:1])[1:] == [NOW_MS + 90_000]
