"""The near horizon: timers due further out than it are pended without their expiring key,
and ``near.lua`` keys them as they come within it (fakeredis + lupa)."""

from __future__ import annotations

from typing import Any

import fakeredis

from tests.unit.helpers import run
from timers import Timers, TimerSpec
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.model.wire import NEAR_HORIZON_MS
from timers.store.script_calls import ScriptCalls


def timer_keys(fake: fakeredis.FakeRedis) -> set[str]:
    return {as_text(k) for k in fake.keys("timers:*")}


def key_of(fake: fakeredis.FakeRedis, ks: Keyspace, timer_id: str) -> str:
    record = as_text(fake.hget(ks.records, timer_id))
    return f"timers:{timer_id}:{record}"


def near(scripts: dict[str, Any], ks: Keyspace, limit: int = 1000) -> tuple[int, bool]:
    until, reached, _ = run(scripts, ScriptCalls(ks).near(limit))
    return int(until), bool(int(reached))


def keyed(scripts: dict[str, Any], ks: Keyspace) -> int:
    """How many keys one ``near.lua`` call wrote."""
    return int(run(scripts, ScriptCalls(ks).near(1000))[2])


def test_a_timer_within_the_horizon_has_its_key_one_beyond_it_has_not(
        fake: fakeredis.FakeRedis, producer: Timers, ks: Keyspace) -> None:
    producer.schedule("reminders.sms", [1], id="near", in_=NEAR_HORIZON_MS / 1000 - 60)
    producer.schedule("reminders.sms", [2], id="far", in_=NEAR_HORIZON_MS / 1000 + 60)
    assert timer_keys(fake) == {key_of(fake, ks, "near")}
    assert fake.zcard(ks.due) == 2 and fake.hlen(ks.records) == 2  # both pending
    assert producer.get("far") is not None


def test_near_keys_the_timers_that_came_within_the_horizon_and_no_others(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    producer.schedule_many([TimerSpec("reminders.sms", [i], id=f"t{i}", in_=10 + i)
                            for i in range(5)] + [
        TimerSpec("reminders.sms", ["late"], id="late", in_=100)])
    assert timer_keys(fake) == {key_of(fake, ks, f"t{i}") for i in range(5)} | {
        key_of(fake, ks, "late")}
    fake.hset(ks.near, "horizon", 12_500)  # as if the horizon were 12.5 s
    producer.schedule("reminders.sms", ["x"], id="x", in_=14)  # pended beyond it: no key
    assert key_of(fake, ks, "x") not in timer_keys(fake)
    until, reached = near(scripts, ks)
    assert reached and key_of(fake, ks, "x") not in timer_keys(fake)  # still beyond
    assert keyed(scripts, ks) == 0
    fake.hset(ks.near, "horizon", 20_000)
    # the timers come within it: x, and t3 and t4 (keyed when scheduled, written again)
    assert keyed(scripts, ks) == 3
    until_after, reached = near(scripts, ks)
    assert reached and until_after > until
    assert key_of(fake, ks, "x") in timer_keys(fake)
    ttl = fake.pttl(key_of(fake, ks, "x"))
    assert 12_000 < ttl <= 14_000  # expires at the timer's due time


def test_a_backlog_is_keyed_in_batches_and_timers_sharing_a_due_time_all_get_theirs(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    fake.hset(ks.near, "horizon", 1_000)
    at = producer.schedule("reminders.sms", [0], id="probe", in_=60)  # a due time to share
    due = producer.get(at)
    assert due is not None
    producer.schedule_many([TimerSpec("reminders.sms", [i], id=f"s{i}", at=due.due)
                            for i in range(7)] + [
        TimerSpec("reminders.sms", [i], id=f"l{i}", in_=61 + i) for i in range(5)])
    assert timer_keys(fake) == set()
    fake.hset(ks.near, "horizon", 3_600_000)
    calls = 0
    reached = False
    while not reached:
        _, reached = near(scripts, ks, limit=3)
        calls += 1
        assert calls < 20
    assert calls > 1
    assert timer_keys(fake) == {key_of(fake, ks, t) for t in
                                ["probe", *(f"s{i}" for i in range(7)),
                                 *(f"l{i}" for i in range(5))]}


def test_near_keys_the_timers_of_every_group_and_priority(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    fake.hset(ks.near, "horizon", 1_000)
    producer.schedule("reminders.sms", [1], id="video", in_=30, group="video")
    producer.schedule("reminders.sms", [2], id="urgent", in_=30, priority=5)
    producer.schedule("reminders.sms", [3], id="plain", in_=30)
    assert timer_keys(fake) == set()
    fake.hset(ks.near, "horizon", 60_000)
    assert near(scripts, ks)[1]
    assert timer_keys(fake) == {key_of(fake, ks, t) for t in ("video", "urgent", "plain")}


def test_rescheduling_beyond_the_horizon_drops_the_key_and_back_within_it_sets_it(
        fake: fakeredis.FakeRedis, producer: Timers, ks: Keyspace) -> None:
    producer.schedule("reminders.sms", [1], id="t", in_=60)
    key = key_of(fake, ks, "t")
    assert key in timer_keys(fake)
    assert producer.reschedule("t", in_=NEAR_HORIZON_MS / 1000 * 3)
    assert key not in timer_keys(fake) and producer.get("t") is not None
    assert producer.reschedule("t", in_=30)
    assert key in timer_keys(fake)


def test_cancelling_a_timer_that_has_no_key_yet_leaves_nothing(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    producer.schedule("reminders.sms", [1], id="far", in_=86_400)
    assert producer.cancel("far")
    assert fake.zcard(ks.due) == 0 and fake.hlen(ks.records) == 0 and not timer_keys(fake)


def test_near_refuses_a_bad_limit(scripts: dict[str, Any], ks: Keyspace) -> None:
    import pytest
    import redis

    with pytest.raises(redis.exceptions.ResponseError, match="bad limit"):
        near(scripts, ks, limit=0)


def test_the_scripts_and_the_python_side_share_one_horizon() -> None:
    from timers.store.lua_source import source

    assert f"local NEAR_HORIZON_MS = {NEAR_HORIZON_MS}\n" in source("near")


def _shared_due(producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace, n: int,
                in_: float = 60) -> list[str]:
    """``n`` timers sharing one due time beyond a 1 s horizon (no keys yet); their ids."""
    fake.hset(ks.near, "horizon", 1_000)
    probe = producer.get(producer.schedule("reminders.sms", [0], id="probe", in_=in_))
    assert probe is not None
    ids = ["probe", *(f"s{i:04}" for i in range(n - 1))]
    producer.schedule_many(TimerSpec("reminders.sms", [i], id=tid, at=probe.due)
                           for i, tid in enumerate(ids[1:]))
    assert timer_keys(fake) == set()
    fake.hset(ks.near, "horizon", 3_600_000)
    return ids


def test_a_thousand_timers_sharing_a_due_time_are_keyed_a_limit_per_call(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    ids = _shared_due(producer, fake, ks, 1_000)
    keyed, calls, reached = 0, 0, False
    while not reached:
        _, reached = near(scripts, ks, limit=64)
        now_keyed = len(timer_keys(fake))
        assert now_keyed - keyed <= 64  # never the whole due time in one call
        keyed, calls = now_keyed, calls + 1
        assert calls <= 1_000 // 64 + 2
    assert timer_keys(fake) == {key_of(fake, ks, t) for t in ids}


def test_a_sweep_goes_on_when_the_timer_it_stopped_at_is_cancelled(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    ids = _shared_due(producer, fake, ks, 300)
    assert not near(scripts, ks, limit=50)[1]
    stopped_at = as_text(fake.hget(ks.near, "cursor")).split(" ", 1)[1]
    assert producer.cancel(stopped_at)
    calls, reached = 0, False
    while not reached:
        _, reached = near(scripts, ks, limit=50)
        calls += 1
        assert calls < 20
    assert timer_keys(fake) == {key_of(fake, ks, t) for t in ids if t != stopped_at}


def test_a_sweep_across_groups_keys_each_group_once_a_limit_per_call(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    fake.hset(ks.near, "horizon", 1_000)
    groups = ("default", "video", "mail")
    producer.schedule_many(TimerSpec("reminders.sms", [i], id=f"{g}{i}", in_=30 + i / 10,
                                     group=g) for g in groups for i in range(40))
    fake.hset(ks.near, "horizon", 60_000)
    calls, reached = 0, False
    while not reached:
        before = len(timer_keys(fake))
        _, reached = near(scripts, ks, limit=25)
        assert len(timer_keys(fake)) - before <= 25
        calls += 1
        assert calls < 20
    assert timer_keys(fake) == {key_of(fake, ks, f"{g}{i}") for g in groups for i in range(40)}
    assert fake.hget(ks.near, "cursor") is None  # the sweep ended


def test_a_garbled_sweep_state_restarts_the_sweep_instead_of_failing_every_call(
        fake: fakeredis.FakeRedis, scripts: dict[str, Any], producer: Timers,
        ks: Keyspace) -> None:
    ids = _shared_due(producer, fake, ks, 120)
    assert not near(scripts, ks, limit=50)[1]  # mid-sweep: a cursor is stored
    sweep = fake.hget(ks.near, "sweep")
    for cursor in ("not-a-number missing", "12x s0001", "", "999 s0001 extra"):
        fake.hset(ks.near, mapping={"cursor": cursor, "sweep": sweep, "index": ks.due})
        calls, reached = 0, False
        while not reached:
            _, reached = near(scripts, ks, limit=50)
            calls += 1
            assert calls < 20
    for state in ({"sweep": "soon", "index": "?"}, {"until": "x"}):
        fake.hset(ks.near, mapping=state)
        calls, reached = 0, False
        while not reached:
            _, reached = near(scripts, ks, limit=50)
            calls += 1
            assert calls < 20
    assert timer_keys(fake) == {key_of(fake, ks, t) for t in ids}


def test_turns_that_find_nothing_to_key_slow_down_and_one_that_keys_speeds_them_up() -> None:
    """An idle listener's keying turns back off from every NEAR_INTERVAL to every
    NEAR_BACKOFF intervals; a turn that keys timers (or fails) brings them back."""
    from timers.listener.finding.near_keys import NEAR_BACKOFF, next_interval
    from timers.model.wire import NEAR_INTERVAL

    waits, interval = [], NEAR_INTERVAL
    for _ in range(8):
        interval = next_interval(interval, 0)
        waits.append(interval)
    assert waits[0] == 2 * NEAR_INTERVAL and waits == sorted(waits)
    assert waits[-1] == NEAR_BACKOFF * NEAR_INTERVAL  # no slower than that
    assert next_interval(waits[-1], 3) == NEAR_INTERVAL
    assert next_interval(waits[-1], None) == NEAR_INTERVAL
