"""The run history, ``status`` in every state and the per-task series, on fakeredis: what a
user reads back after the listener ended timers (``timers history``, ``timers get``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest

import timers
from tests.unit.helpers import claim, redis_now_ms, run_burst
from timers import Timers
from timers.listener.endings.history import HistoryPolicy
from timers.model.encoding import as_text
from timers.model.history import (
    DEFAULT_HISTORY_AGE,
    DEFAULT_HISTORY_COUNT,
    EndKind,
    HistoryRecord,
    MinuteSlot,
    MinuteStats,
    TimerState,
    bucket_of,
    histogram_percentile,
)
from timers.model.keys import Keyspace
from timers.model.policy import history_age, policy_of
from timers.store.script_calls import ScriptCalls
from timers.store.script_modes import register_all

PAST = datetime(2001, 1, 1, tzinfo=UTC)


def test_each_end_state_reads_back_with_how_when_where(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    producer.schedule("mod.add", [1, 2], at=PAST, id="ok")
    producer.schedule("mod.boom", ["bad input"], at=PAST, id="dead")
    producer.schedule("mod.add", [1], in_=3600, id="off")
    assert producer.cancel("off")
    listener = run_burst(server)

    done = producer.status("ok")
    assert done.state is TimerState.COMPLETED and done.ended is not None
    assert done.ended.listener == listener.id and done.ended.attempts == 1
    host, pid, _ = listener.id.split(":")
    assert (done.ended.host, done.ended.pid) == (host, int(pid))
    assert done.ended.duration_ms is not None and done.ended.lateness_ms is not None
    assert done.ended.lateness_ms > 0  # due in 2001
    assert abs(done.ended.ended - time.time()) < 60
    dead = producer.status("dead")
    assert dead.state is TimerState.DEAD and dead.ended is not None
    assert dead.ended.error == "ValueError: bad input"
    off = producer.status("off")
    assert off.state is TimerState.CANCELLED and off.ended is not None
    assert off.ended.task == "mod.add" and off.ended.duration_ms is None
    assert ":" in off.ended.listener  # host:pid of who cancelled
    assert off.detail.startswith("cancelled ") and off.detail.endswith(
        f" by {off.ended.listener}"), off.detail
    assert done.detail.startswith("completed ") and f" on {listener.id} (attempt 1, ran " in (
        done.detail), done.detail
    assert producer.status("never").state is TimerState.UNKNOWN


def test_history_lists_newest_first_and_filters(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    producer.schedule("mod.add", [1], at=PAST, id="a1")
    producer.schedule("mod.boom", ["x"], at=PAST, id="b1")
    producer.schedule("mod.greet", ["you"], at=PAST, id="g1")
    run_burst(server)
    producer.schedule("mod.add", [2], in_=60, id="a2")
    producer.cancel("a2")

    everything = producer.history()
    assert everything[0].id == "a2"
    assert {r.id for r in everything} == {"a1", "b1", "g1", "a2"}
    assert [r.ended for r in everything] == sorted((r.ended for r in everything),
                                                      reverse=True)
    assert [r.id for r in producer.history(task="mod.add")] == ["a2", "a1"]
    assert [r.id for r in producer.history(failed=True)] == ["b1"]
    assert len(producer.history(limit=2)) == 2
    assert producer.history(since=time.time() + 60) == []


def test_count_retention_keeps_the_newest(server: fakeredis.FakeServer,
                                          producer: Timers) -> None:
    producer.schedule_many([{"task": "mod.add", "args": [i], "at": PAST, "id": f"t{i}"}
                            for i in range(6)])
    run_burst(server, history=HistoryPolicy(count=2))
    assert len(producer.history()) == 2
    assert sum(producer.status(f"t{i}").state is TimerState.COMPLETED for i in range(6)) == 2


def test_zero_keeps_none_and_a_task_may_opt_out(server: fakeredis.FakeServer,
                                                producer: Timers) -> None:
    producer.schedule("kept.quiet", at=PAST, id="q")
    producer.schedule("mod.add", [1], at=PAST, id="loud")
    run_burst(server)
    assert producer.status("q").state is TimerState.UNKNOWN
    assert producer.status("loud").state is TimerState.COMPLETED
    assert "kept.quiet" in producer.tasks_seen()  # its series is kept

    producer.schedule("mod.add", [1], at=PAST, id="later")
    run_burst(server, history=HistoryPolicy(age=0))
    assert producer.status("later").state is TimerState.UNKNOWN
    assert producer.history() == []  # 0 keeps none: what was kept goes too
    producer.schedule("mod.add", [1], in_=60, id="gone")
    assert producer.cancel("gone")  # cancel keeps to the listeners' retention
    assert producer.status("gone").state is TimerState.UNKNOWN


def test_age_retention_trims_old_records_a_few_per_call(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    old = HistoryRecord("x", "mod.add", EndKind.COMPLETED, 1.0, "h:1:a", 3, 1, 4)
    for i in range(5):  # release 0.1.0's batches (":<n>", in no task or dead index)
        fake.zadd(ks.history, {f":{i}": 1000})
        fake.zadd(ks.history_expiry, {f":{i}": 1000 + 3_600_000})
        fake.hset(ks.history_batches, f":{i}", f"old{i}")
        fake.hset(ks.history_records, f"old{i}", f":{i}|{old.encode()}")
    producer.schedule("mod.add", [1], at=PAST, id="new")
    run_burst(server, history=HistoryPolicy(age=3600))
    assert [r.id for r in producer.history()] == ["new"]
    assert fake.hlen(ks.history_records) == fake.zcard(ks.history_expiry) == 1


def test_a_newer_end_of_an_id_replaces_its_older_one_and_outlives_its_batch(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    producer.schedule_many([{"task": "mod.add", "args": [1], "at": PAST, "id": i}
                            for i in ("again", "other")])
    run_burst(server)
    first = producer.status("again").ended
    producer.schedule("kept.brief", None, at=PAST, id="again")
    run_burst(server)
    assert sorted(r.id for r in producer.history()) == ["again", "other"]  # once each
    newer = producer.status("again").ended
    assert newer is not None and newer.task == "kept.brief" and first is not None
    trim(fake, ks, count=1)  # drops "other", and the first batch with it
    assert [(r.id, r.task) for r in producer.history()] == [("again", "kept.brief")]
    assert fake.zcard(ks.history) == fake.hlen(ks.history_records) == 1
    let_history_age(fake, ks, 2 * 3600)  # its task keeps an hour
    trim(fake, ks)
    assert producer.history() == [] and fake.hlen(ks.history_batches) == 0


def test_a_batch_id_met_again_keeps_both_batches_records_indexed(
        fake: fakeredis.FakeRedis, producer: Timers) -> None:
    # the sequence that names batches was reset (say, its key deleted): the next batch id
    # is one the history holds already, and no record may be left out of the index
    ks = producer.keys
    now = redis_now_ms(fake)
    old = HistoryRecord("older", "mod.add", EndKind.COMPLETED, now / 1000 - 1, "h:1:a")
    fake.hset(ks.history_records, "older", f"::5|{old.encode()}")
    fake.hset(ks.history_batches, "::5", "older")
    fake.zadd(ks.history, {"::5": now - 1000})
    fake.zadd(ks.history_expiry, {"::5": now - 1000 + 3_600_000})
    fake.set(ks.sequence, 4)
    producer.schedule("mod.add", [1], in_=60, id="newer")
    assert producer.cancel("newer")  # its batch: "::5" again
    assert fake.hget(ks.history_batches, "::5") == b"older:newer"
    assert {r.id for r in producer.history()} == {"older", "newer"}
    let_history_age(fake, ks, 30 * 86400)
    trim(fake, ks)
    assert producer.history() == [] and fake.hlen(ks.history_records) == 0


def let_history_age(fake: fakeredis.FakeRedis, ks: Keyspace, seconds: float) -> None:
    """As if ``seconds`` had passed for the history: every record ended and expires that
    much earlier (Redis' clock cannot be moved; ``timers.testing.advance`` moves due
    times the same way)."""
    shift = -round(seconds * 1000)
    for key in (ks.history, ks.history_expiry):
        for member in fake.zrange(key, 0, -1):
            fake.zincrby(key, shift, member)


def scores_by_id(fake: fakeredis.FakeRedis, ks: Keyspace, key: str) -> dict[str, float]:
    """Each kept record's score in history index ``key`` (``P|hist`` or ``P|histexp``):
    its batch's, the batch its stored value names."""
    out = {}
    for field, value in fake.hgetall(ks.history_records).items():
        score = fake.zscore(key, as_text(value).split("|", 1)[0])
        if score is not None:
            out[as_text(field)] = score
    return out


def trim(fake: fakeredis.FakeRedis, ks: Keyspace, count: int = DEFAULT_HISTORY_COUNT) -> None:
    """One listener's trim (its trim.lua calls, till none owes more)."""
    call = ScriptCalls(ks).trim(count, 250)
    script = register_all(fake)["trim"]
    while script(keys=list(call.keys), args=list(call.args))[1]:
        pass


def ended_ids(producer: Timers) -> set[str]:
    return {r.id for r in producer.history()}


def test_a_task_keeps_its_ended_timers_its_own_age(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    for task in ("kept.brief", "kept.long", "kept.none", "mod.add"):
        producer.schedule(task, [1] if task == "mod.add" else None, at=PAST, id=task)
    run_burst(server)  # the listener's age: the default, 7 days
    assert ended_ids(producer) == {"kept.brief", "kept.long", "mod.add"}
    assert producer.status("kept.none").state is TimerState.UNKNOWN  # 0 keeps none
    ended = scores_by_id(fake, ks, ks.history)
    expires = scores_by_id(fake, ks, ks.history_expiry)
    assert {i: expires[i] - ended[i] for i in ended} == {
        "kept.brief": 3_600_000, "kept.long": 30 * 86_400_000,
        "mod.add": DEFAULT_HISTORY_AGE * 1000}

    let_history_age(fake, ks, 2 * 3600)
    trim(fake, ks)
    assert ended_ids(producer) == {"kept.long", "mod.add"}  # the shorter age went first
    gone = producer.status("kept.brief")
    assert gone.state is TimerState.UNKNOWN and "never existed" in gone.detail
    let_history_age(fake, ks, 8 * 86400)
    trim(fake, ks)
    assert ended_ids(producer) == {"kept.long"}  # kept longer than the listener's 7 days
    assert producer.status("mod.add").state is TimerState.UNKNOWN
    let_history_age(fake, ks, 30 * 86400)
    trim(fake, ks)
    assert producer.history() == [] and fake.hlen(ks.history_records) == 0
    assert fake.zcard(ks.history_expiry) == 0
    assert producer.status("kept.long").state is TimerState.UNKNOWN


def test_a_record_past_its_age_reads_unknown_before_any_trim(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    # no listener running: nothing trims, but the retention holds for what status says
    producer.schedule("kept.brief", None, at=PAST, id="brief")
    run_burst(server)
    assert producer.status("brief").state is TimerState.COMPLETED
    let_history_age(fake, producer.keys, 2 * 3600)  # its task keeps its ends an hour
    gone = producer.status("brief")
    assert gone.state is TimerState.UNKNOWN and "never existed" in gone.detail
    assert fake.hexists(producer.keys.history_records, "brief")  # not trimmed yet


def test_the_count_bound_drops_the_oldest_ends_whatever_their_age(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    producer.schedule_many([{"task": "kept.long", "at": PAST, "id": f"long{i}"}
                            for i in range(3)])
    run_burst(server)
    let_history_age(fake, ks, 60)  # they ended a minute before the others
    producer.schedule_many([{"task": "kept.brief", "at": PAST, "id": f"brief{i}"}
                            for i in range(3)])
    run_burst(server, history=HistoryPolicy(count=4))
    # the four newest ends: every brief one, though the long ones expire a month later
    kept = ended_ids(producer)
    assert len(kept) == 4 and {"brief0", "brief1", "brief2"} < kept
    assert fake.hlen(ks.history_records) == 4  # the oldest batch was cut to its newest
    assert len(scores_by_id(fake, ks, ks.history)) == 4
    assert len(scores_by_id(fake, ks, ks.history_expiry)) == 4
    trim(fake, ks, count=1)
    (newest,) = producer.history()
    assert newest.id.startswith("brief")
    assert fake.hlen(ks.history_records) == 1
    assert fake.zcard(ks.history) == fake.zcard(ks.history_expiry) == 1  # one batch left


def test_a_cancel_keeps_to_its_tasks_age(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    producer.schedule("mod.add", [1], at=PAST, id="first")
    run_burst(server)  # its first finish call stores the tasks' own ages
    assert fake.hget(ks.history_task_ages, "kept.brief") == b"3600000"
    assert fake.hget(ks.history_task_ages, "kept.none") == b"0"
    assert fake.hget(ks.history_task_ages, "mod.add") is None  # the listeners' age
    for task in ("kept.brief", "kept.none", "mod.add"):
        producer.schedule(task, [1] if task == "mod.add" else None, in_=3600, id=task)
        assert producer.cancel(task)
    assert producer.status("kept.none").state is TimerState.UNKNOWN
    assert producer.status("kept.brief").state is TimerState.CANCELLED
    ended = scores_by_id(fake, ks, ks.history)
    expires = scores_by_id(fake, ks, ks.history_expiry)
    assert expires["kept.brief"] == ended["kept.brief"] + 3_600_000
    assert expires["mod.add"] == ended["mod.add"] + DEFAULT_HISTORY_AGE * 1000


def test_a_listener_stores_its_retention_before_anything_ends(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    ks = producer.keys
    run_burst(server, history=HistoryPolicy(age=3600, count=9))  # nothing was due
    assert fake.get(ks.history_retention) == b"3600000 9"
    assert fake.hget(ks.history_task_ages, "kept.long") == b"2592000000"
    producer.schedule("mod.add", [1], in_=60, id="off")
    assert producer.cancel("off")
    assert (scores_by_id(fake, ks, ks.history_expiry)["off"]
            == scores_by_id(fake, ks, ks.history)["off"] + 3_600_000)


@pytest.mark.parametrize(("given", "age"), [
    (True, None), (None, None), (False, 0.0), (0, 0.0), ("7d", 604800.0), (90, 90.0),
    ("1h30m", 5400.0), (timedelta(days=2), 172800.0)])
def test_history_takes_on_off_or_how_long(given: Any, age: float | None) -> None:
    assert history_age(given) == age
    policy = policy_of(timers.task(history=given)(lambda: None))
    assert policy.history == age
    assert policy.history_ms == (None if age is None else round(age * 1000))


@pytest.mark.parametrize("bad", ["7x", "", "-1h", -5, float("nan"), float("inf"), "1e400",
                                 [7], 1000 * 365 * 86400])
def test_a_bad_history_value_fails_at_decoration_with_one_line(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^history must be True, False, or how long") as e:
        timers.task(history=bad)
    assert "\n" not in str(e.value) and e.value.__cause__ is None


def test_waiting_pending_and_running_say_on_what_and_where(
        server: fakeredis.FakeServer, fake: fakeredis.FakeRedis, producer: Timers) -> None:
    producer.schedule("kept.flaky", at=PAST, id="retry")
    run_burst(server)
    retry = producer.status("retry")
    assert (retry.state, retry.waiting_on) == (TimerState.WAITING, "retry")
    assert "attempt 2" in retry.detail

    producer.schedule("mod.add", [1], in_=3600, id="later")
    assert producer.status("later").state is TimerState.PENDING
    producer.schedule("mod.add", [1], at=PAST, id="grouped", group="video")
    grouped = producer.status("grouped")
    assert (grouped.state, grouped.waiting_on) == (TimerState.WAITING, "group")

    producer.schedule("mod.add", [1], at=PAST, id="busy")
    (_run,) = claim(register_all(fake), producer.keys, listener="h:42:abc").claimed
    busy = producer.status("busy")
    assert (busy.state, busy.listener, busy.attempt) == (TimerState.RUNNING, "h:42:abc", 1)
    assert busy.since == PAST


def test_series_counts_runs_failures_and_percentiles_per_minute(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    producer.schedule_many([{"task": "mod.add", "args": [i], "at": PAST} for i in range(3)])
    producer.schedule("mod.boom", ["x"], at=PAST)
    run_burst(server)
    minutes = producer.series("mod.add", minutes=5)
    assert len(minutes) == 5 and all(isinstance(m, MinuteStats) for m in minutes)
    assert [m.minute for m in minutes] == sorted(m.minute for m in minutes)
    assert minutes[-1].minute % 60 == 0 and minutes[-1].minute <= time.time()
    last = minutes[-1] if minutes[-1].runs else minutes[-2]  # (the minute may have turned)
    assert (last.runs, last.failures) == (3, 0)
    assert last.lateness_p50_ms == 3_600_000  # due in 2001: the top bucket, "1 h or more"
    everything = producer.series(minutes=2)
    assert sum(m.runs for m in everything) == 4 and sum(m.failures for m in everything) == 1
    assert sorted(producer.tasks_seen()) == ["mod.add", "mod.boom"]
    assert sum(m.runs for m in producer.series("mod.greet", minutes=1440)) == 0


def test_two_batches_of_one_minute_add_up_in_the_ring(fake: fakeredis.FakeRedis,
                                                      producer: Timers) -> None:
    scripts, calls = register_all(fake), ScriptCalls(producer.keys)
    minute = redis_now_ms(fake) // 60_000
    first = MinuteSlot(minute, 2, 1, {0: 2}, {3: 1, 4: 1})
    second = MinuteSlot(minute, 1, 0, {0: 1}, {4: 1})
    for slot in (first, second):
        call = calls.finish(retention_ms=1000, endings=[], series=[("t.x", slot.encode())])
        scripts["finish"](keys=list(call.keys), args=list(call.args))
    (stored,) = [MinuteSlot.decode(v.decode()) for v in fake.hvals(producer.keys.series)]
    assert stored == MinuteSlot(minute, 3, 1, {0: 3}, {3: 1, 4: 2})
    stale = MinuteSlot(minute - 1440, 9, 9)  # a day older: the slot holds a newer minute
    call = calls.finish(retention_ms=1000, endings=[], series=[("t.x", stale.encode())])
    scripts["finish"](keys=list(call.keys), args=list(call.args))
    assert producer.series("t.x", minutes=1)[-1].runs in (0, 3)  # (unless the minute turned)
    assert MinuteSlot.decode(fake.hvals(producer.keys.series)[0].decode()) == stored


def test_histogram_percentiles_and_buckets() -> None:
    assert bucket_of(0) == 0 and bucket_of(1) == 0 and bucket_of(1.5) == 1
    assert bucket_of(10**9) == 17
    assert histogram_percentile({}, 50) == 0.0
    assert histogram_percentile({2: 100}, 50) == pytest.approx(3.5)  # within (2, 5]
    assert histogram_percentile({0: 99, 17: 1}, 99) == pytest.approx(1.0)
    assert histogram_percentile({0: 98, 17: 2}, 99) == 3_600_000


def test_sharded_history_and_series_read_every_shard(server: fakeredis.FakeServer) -> None:
    producer = Timers(fakeredis.FakeRedis(server=server), shards=3)
    ids = producer.schedule_many([{"task": "mod.add", "args": [i], "at": PAST}
                                  for i in range(9)])
    run_burst(server, shards=3)
    assert {r.id for r in producer.history()} == set(ids)
    assert all(producer.status(i).state is TimerState.COMPLETED for i in ids)
    assert sum(m.runs for m in producer.series("mod.add", minutes=2)) == 9
