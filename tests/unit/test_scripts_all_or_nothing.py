"""Every Lua script checks what it parses before its first write: driven with bad input,
each fails and Redis is exactly as it was (issue 9, "scripts are all-or-nothing")."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis

from tests.unit.helpers import claim
from timers import InvalidArgs, Timers
from timers.model.keys import Keyspace
from timers.store.script_calls import ScriptCalls
from timers.store.script_manifest import ScriptName
from timers.store.script_rows import NewTimer

FAR = 3600.0


def snapshot(fake: fakeredis.FakeRedis) -> dict[bytes, Any]:
    """Every key with its type and whole content."""
    out: dict[bytes, Any] = {}
    for key in fake.keys("*"):
        kind = fake.type(key)
        if kind == b"string":
            out[key] = (kind, fake.get(key), fake.pttl(key) > 0)
        elif kind == b"hash":
            out[key] = (kind, fake.hgetall(key))
        elif kind == b"zset":
            out[key] = (kind, fake.zrange(key, 0, -1, withscores=True))
        else:
            out[key] = (kind, None)
    return out


@pytest.fixture
def busy(producer: Timers, scripts: dict[ScriptName, Any], ks: Keyspace,
         fake: fakeredis.FakeRedis) -> dict[str, str]:
    """A keyspace with pending timers, a running one, a failure and a recurrence."""
    producer.schedule("a.b", [1], in_=-1, id="due")
    producer.schedule("a.b", [2], in_=FAR, id="later")
    (run,) = claim(scripts, ks).claimed
    producer.schedule("a.b", [3], in_=FAR / 2, id="mid")
    fake.zadd(ks.failures, {"old:1": 1})
    fake.hset(ks.failure_records, "old:1", "{}")
    fake.zadd(ks.failure_index, {"old:1": 0})
    producer.every("nightly", "a.b", cron="0 3 * * *")
    return {"token": run.token}


def call(scripts: dict[ScriptName, Any], name: ScriptName, keys: list[str],
         args: list[Any]) -> Any:
    return scripts[name](keys=keys, args=args)


NO_TAKER = ["me", "default", 0, 0, 0, 0, 0, 1, 0, 0]
"""finish.lua's listener id, groups, take, lease and follow: hand nothing over; then the
history's age and count (none kept), the retention stored, no series entries and no task
age entries."""


def finish_keys(ks: Keyspace) -> list[str]:
    return list(ScriptCalls(ks).finish(retention_ms=0, endings=()).keys)


def schedule_args(ks: Keyspace, *timers: tuple[str, str, str, str, str]) -> tuple[
        list[str], list[Any]]:
    """Raw values on purpose (bad ones included): the script must check them."""
    call = ScriptCalls(ks).schedule([NewTimer(*t) for t in timers])  # type: ignore[arg-type]
    return list(call.keys), list(call.args)


GOOD = ("new", "a.b:[1]", "in", "1000", "r")
BAD_SCHEDULES = {
    "ms not an integer": ("x", "a.b:", "in", "1.5", "r"),
    "ms not a number": ("x", "a.b:", "in", "soon", "r"),
    "unknown mode": ("x", "a.b:", "later", "10", "r"),
    "unknown flag": ("x", "a.b:", "in", "10", "z"),
    "at before 1970": ("x", "a.b:", "at", "-5000", "r"),
    "id with a colon": ("x:y", "a.b:", "in", "10", "r"),
    "record without args": ("x", "a.b", "in", "10", "r"),
    "empty id": ("", "a.b:", "in", "10", "r"),
}


@pytest.mark.parametrize("bad", BAD_SCHEDULES.values(), ids=BAD_SCHEDULES.keys())
def test_schedule_with_one_bad_timer_writes_nothing_at_all(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, bad: tuple[str, str, str, str, str],
) -> None:
    before = snapshot(fake)
    keys, args = schedule_args(ks, GOOD, bad)  # the good one comes first
    with pytest.raises(redis.ResponseError, match="timers schedule"):
        call(scripts, "schedule", keys, args)
    keys, args = schedule_args(ks, GOOD)
    with pytest.raises(redis.ResponseError, match="timers schedule"):
        call(scripts, "schedule", keys, [*args, "extra"])
    assert snapshot(fake) == before


BAD_RESCHEDULES = {"ms": ["in", "1e3"], "mode": ["by", "10"], "at before 1970": ["at", "-1"]}


@pytest.mark.parametrize("bad", BAD_RESCHEDULES.values(), ids=BAD_RESCHEDULES.keys())
def test_reschedule_with_bad_arguments_writes_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, bad: list[str],
) -> None:
    before = snapshot(fake)
    with pytest.raises(redis.ResponseError, match="timers reschedule"):
        call(scripts, "reschedule", list(ScriptCalls(ks).reschedule("x", "in", 0).keys),
             [ks.timer_key_start, ks.wake_channel, "later", *bad])
    assert snapshot(fake) == before


@pytest.mark.parametrize("bad", [["x", "1000", "0"], ["10", "-5", "0"], ["10", "1000", ""]])
def test_claim_with_bad_numbers_writes_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, bad: list[str],
) -> None:
    fake.zadd(ks.due, {"mid": 0})  # something to claim
    before = snapshot(fake)
    with pytest.raises(redis.ResponseError, match="timers claim"):
        good = ScriptCalls(ks).claim(limit=1, lease_ms=1, horizon_ms=0, listener_id="")
        call(scripts, "claim", list(good.keys), [ks.timer_key_start, *bad])
    assert snapshot(fake) == before


def test_renew_and_heartbeat_with_bad_numbers_write_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis,
) -> None:
    calls = ScriptCalls(ks)
    before = snapshot(fake)
    with pytest.raises(redis.ResponseError, match="timers renew"):
        call(scripts, "renew", list(calls.renew(0, ()).keys), ["15s", busy["token"]])
    with pytest.raises(redis.ResponseError, match="timers heartbeat"):
        call(scripts, "heartbeat", list(calls.heartbeat("me", 0, "").keys), ["me", "-1", "{}"])
    assert snapshot(fake) == before


def ending(token: str, kind: str, a: str = "", b: str = "", hid: str = "",
           record: str = "", age: str = "") -> list[str]:
    return [token, kind, a, b, hid, record, age]


BAD_ENDINGS: dict[str, Callable[[str], list[str]]] = {
    "unknown kind": lambda t: ending(t, "done"),
    "retry entry without a record": lambda t: ending(t, "retry", "due", "0"),
    "retry delay not an integer": lambda t: ending(t, "retry", "due:a.b:[1]", "0.5"),
    "negative retry delay": lambda t: ending(t, "retry", "due:a.b:[1]", "-10"),
    "failure without an id": lambda t: ending(t, "fail", "", "{}"),
    "reject with a token": lambda t: ending(t, "reject", "x", "{}"),
    "ok without a token": lambda t: ending("", "ok"),
    "a value missing": lambda t: [t, "ok", "", "", "", ""],
    "history record that does not read": lambda t: ending(t, "ok", "", "", "x", "c"),
    "history record without an id": lambda t: ending(t, "ok", "", "", "",
                                                     "co|1|2|1|3|me|a.b|"),
    "history age of 0": lambda t: ending(t, "ok", "", "", "due", "co|1|2|1|3|me|a.b|", "0"),
    "history age not a number": lambda t: ending(t, "ok", "", "", "due", "co|1|2|1|3|me|a.b|",
                                                 "7d"),
    "history age without a record": lambda t: ending(t, "ok", "", "", "", "", "1000"),
    "history record of a retry": lambda t: ending(
        t, "retry", "due:a.b:[1]", "10", "due", "co|1|2|1|3|me|a.b|"),
    "history count of 0": lambda t: ending(t, "ok", "", "", "due", "co|1|2|1|3|me|a.b|", "|0"),
    "history count not a number": lambda t: ending(t, "ok", "", "", "due",
                                                   "co|1|2|1|3|me|a.b|", "1000|many"),
    "history count without a record": lambda t: ending(t, "ok", "", "", "", "", "|3"),
    "history count with a record naming no task": lambda t: ending(
        t, "ok", "", "", "due", "co|1|2|1|3|me||", "|3"),
    "history count with a record whose end is not a number": lambda t: ending(
        t, "ok", "", "", "due", "co|soon|2|1|3|me|a.b|", "|3"),
}


@pytest.mark.parametrize("bad", BAD_ENDINGS.values(), ids=BAD_ENDINGS.keys())
def test_finish_with_one_bad_ending_writes_nothing_not_even_the_good_ones(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, bad: Callable[[str], list[str]],
) -> None:
    before = snapshot(fake)
    args = [ks.timer_key_start, ks.wake_channel, 86_400_000, *NO_TAKER,
            *ending(busy["token"], "ok"), *ending("", "reject", ":zz", "{}"), *bad("999")]
    with pytest.raises(redis.ResponseError, match="timers finish"):
        call(scripts, "finish", finish_keys(ks), args)
    with pytest.raises(redis.ResponseError, match="timers finish: bad arguments"):  # retention
        call(scripts, "finish", finish_keys(ks),
             [ks.timer_key_start, ks.wake_channel, "1h", *NO_TAKER,
              *ending(busy["token"], "ok")])
    assert snapshot(fake) == before


BAD_HEADERS = {
    # finish.lua's ARGV[n] (3: failure retention; 6 to 12: take, lease, follow, history age
    # and count, retention stored, series entries), each given a value it refuses
    3: "1h", 6: "two", 7: "-5", 8: "yes", 9: "7d", 10: "many", 11: "2", 12: "x",
}


@pytest.mark.parametrize("index,bad", BAD_HEADERS.items(),
                         ids=[f"ARGV[{n}]" for n in BAD_HEADERS])
def test_finish_with_one_bad_argument_before_its_endings_writes_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, index: int, bad: str,
) -> None:
    before = snapshot(fake)
    args: list[Any] = [ks.timer_key_start, ks.wake_channel, 86_400_000, *NO_TAKER,
                       *ending(busy["token"], "ok")]
    args[index - 1] = bad
    with pytest.raises(redis.ResponseError, match="timers finish: bad arguments"):
        call(scripts, "finish", finish_keys(ks), args)
    assert snapshot(fake) == before


BAD_TASK_ENTRIES = {
    "count not a number": [("a.b", "", "3"), ("c.d", "", "three")],
    "age not a number": [("a.b", "1h", "")],
    "no task": [("", "", "3")],
    "task with a bar": [("a|b", "", "3")],
    "task twice": [("a.b", "", "3"), ("a.b", "", "")],
}


@pytest.mark.parametrize("bad", BAD_TASK_ENTRIES.values(), ids=BAD_TASK_ENTRIES.keys())
def test_finish_with_one_bad_task_entry_writes_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, bad: list[tuple[str, str, str]],
) -> None:
    fake.hset(ks.history_task_counts, "c.d", "5")  # a count the bad call would remove
    fake.zadd(ks.history_task("c.d"), {"old": 1})
    before = snapshot(fake)
    good = ScriptCalls(ks).finish(retention_ms=1000, endings=[(busy["token"], "ok", "", "")],
                                  store_retention=True, task_retention=[("c.d", "", ""), *bad])
    with pytest.raises(redis.ResponseError, match="timers finish: bad task entry"):
        call(scripts, "finish", list(good.keys), list(good.args))
    assert snapshot(fake) == before


def test_a_run_due_before_1970_is_handed_back_not_lost(
    scripts: dict[ScriptName, Any], ks: Keyspace, fake: fakeredis.FakeRedis,
    producer: Timers,
) -> None:
    """Issue 9 row 7: finish failed after it had deleted the run's lease: timer lost."""
    fake.hset(ks.records, "old", "a.b:[1]")  # as an earlier version stored it
    fake.zadd(ks.due, {"old": -5000})
    (run,) = claim(scripts, ks).claimed
    assert run.due_ms == -5000

    call(scripts, "finish", finish_keys(ks),
         [ks.timer_key_start, ks.wake_channel, 1000, *NO_TAKER, *ending(run.token, "release")])

    assert fake.zscore(ks.due, "old") == -5000
    assert fake.hget(ks.records, "old") == b"a.b:[1]"
    assert fake.zcard(ks.running) == 0
    assert producer.stats().counters["handed_back"] == 1
    (again,) = claim(scripts, ks).claimed
    assert again.entry == "old:a.b:[1]"


def test_a_release_whose_run_record_does_not_read_keeps_its_lease(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis,
) -> None:
    """It lapses and runs again, rather than fail the batch or drop the run."""
    fake.hset(ks.running_records, busy["token"], "garbage")
    before = snapshot(fake)
    call(scripts, "finish", finish_keys(ks),
         [ks.timer_key_start, ks.wake_channel, 1000, *NO_TAKER, *ending(busy["token"], "release")])
    fake.delete(ks.history_retention)  # the listener's history retention, stored by any call
    assert snapshot(fake) == before


def test_cron_scripts_with_bad_numbers_write_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis,
) -> None:
    declare = ScriptCalls(ks).cron_declare(
        name_field="nightly", definition="{}", read_state="", paused="0", version=9,
        anchor_ms=0, record="a.b:", due_if_withdrawn=1, due_otherwise=2)
    step = ScriptCalls(ks).cron_next(name_field="nightly", version=1, due_ms=1,
                                     successor_ms=2, record="a.b:", defer=False, take="",
                                     release="")
    before = snapshot(fake)
    with pytest.raises(redis.ResponseError, match="timers cron_declare"):
        call(scripts, "cron_declare", list(declare.keys),
             [ks.timer_key_start, ks.wake_channel, "nightly", "{}", "", "0", "9", "0",
              "a.b:", "soon", "-1"])
    with pytest.raises(redis.ResponseError, match="timers cron_next"):
        call(scripts, "cron_next",
             list(step.keys),
             [ks.timer_key_start, ks.wake_channel, "nightly", "1", "12.5", "-1", "", "0",
              "", ""])
    assert snapshot(fake) == before


def test_scripts_with_nothing_to_do_change_nothing(
    busy: dict[str, str], scripts: dict[ScriptName, Any], ks: Keyspace,
    fake: fakeredis.FakeRedis, producer: Timers,
) -> None:
    before = snapshot(fake)
    assert producer.cancel("nope") is False
    assert producer.reschedule("nope", in_=5) is False
    assert producer.pause("nope") is False
    assert producer.unschedule_recurring("nope") is False
    assert call(scripts, "forget", list(ScriptCalls(ks).forget("old:1", "").keys),
                ["old:1", "changed"]) == 0
    assert snapshot(fake) == before


def test_args_nested_too_deeply_are_refused_before_anything_is_sent(
    producer: Timers, fake: fakeredis.FakeRedis,
) -> None:
    args: Any = []
    for _ in range(10_000):
        args = [args]
    with pytest.raises(InvalidArgs):
        producer.schedule("a.b", args, in_=1)
    assert fake.keys("*") == []


def test_the_original_due_time_survives_retries_into_the_failure_record() -> None:
    from timers.model.runs import Outcome, Run, failure_entry

    first = Run("7", "t", "a.b:[1]", due_ms=1000, reruns=0, source="s")
    retry = Run("9", "t", "a.b;a=2;d=1000;f=1500:[1]", due_ms=4000, reruns=0, source="s")
    for run in (first, retry):
        failure_id, record = failure_entry(run, Outcome("error", "E", "boom"), "a.b", [1],
                                           now_ms=5000)
        assert json.loads(record.to_json())["due_ms"] == 1000
        assert failure_id == f"t:{run.token}"
