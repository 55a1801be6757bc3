"""The producer API (:class:`timers.Timers` and :class:`timers.AsyncTimers`) on fakeredis."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, given, settings

import timers.model.timer_ids as timer_ids_module
import timers.ops.operations
import timers.ops.sharded
from tests.unit.helpers import claim, redis_now_ms
from tests.unit.test_encoding import json_args, timer_ids
from timers import AsyncTimers, Timers, TimerSpec
from timers.exceptions import (
    InvalidArgs,
    InvalidDueTime,
    InvalidTask,
    InvalidTimer,
    InvalidTimerId,
    ServerOutOfMemory,
    ServerUnavailable,
)
from timers.model.encoding import Entry, as_text, is_occurrence_id
from timers.model.keys import Keyspace
from timers.model.timer_ids import ALPHABET, IdSequence
from timers.ops.operations import SCHEDULE_CHUNK
from timers.store.script_modes import register_all


@pytest.fixture
def every_timer_near(fake: fakeredis.FakeRedis) -> None:
    """For tests about the expiring keys: a near horizon of a year keys every timer they
    schedule (tests/unit/test_near_keys.py covers timers beyond it)."""
    fake.hset(Keyspace().near, "horizon", 365 * 86_400_000)

FAR = 3600.0  # seconds: due long after any test ends


def timer_keys(client: fakeredis.FakeRedis) -> list[str]:
    """Names of the expiring timer keys (system keys use '|' after the prefix)."""
    return sorted(as_text(k) for k in client.keys("timers:*"))


def index_sizes(client: fakeredis.FakeRedis) -> tuple[int, int]:
    keys = Keyspace()
    return client.zcard(keys.due), client.hlen(keys.records)


def ms(value: datetime) -> int:
    return round(value.timestamp() * 1000)


# -- schedule and get --------------------------------------------------------------------


def test_schedule_returns_an_id_and_get_returns_the_timer(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    before = redis_now_ms(fake)
    tid = producer.schedule("reminders.sms", {"user_id": 42}, in_=60)
    after = redis_now_ms(fake)
    assert isinstance(tid, str) and tid

    timer = producer.get(tid)
    assert timer is not None
    assert (timer.id, timer.task, timer.args, timer.attempts) == (
        tid, "reminders.sms", {"user_id": 42}, 0)
    assert before + 60_000 <= ms(timer.due) <= after + 60_000


def test_generated_ids_are_distinct(producer: Timers) -> None:
    ids = {producer.schedule("a.b", in_=FAR) for _ in range(50)}
    assert len(ids) == 50


def test_a_generated_id_never_starts_with_a_dash() -> None:
    """``timers get -x…`` would read the id as an option."""
    ids = [timers.ops.operations.new_timer_id() for _ in range(1000)]
    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 14 and set(i) <= set(ALPHABET) for i in ids)


def test_generated_ids_sort_in_the_order_they_were_made_within_and_across_milliseconds(
) -> None:
    """Timers due at the same ms run in id order: ids in schedule order make that FIFO."""
    clock = iter([5_000] * 300 + [5_001] * 300 + [4_000] * 10)  # the wall clock steps back
    sequence = IdSequence(lambda: next(clock))
    ids = [sequence.next() for _ in range(610)]
    assert ids == sorted(ids) and len(set(ids)) == 610


def test_same_due_timers_scheduled_in_one_call_are_claimed_in_schedule_order(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    producer.schedule_many(TimerSpec("a.b", [i], in_=60) for i in range(200))
    members = [m.decode() for m in fake.zrange(ks.due, 0, -1)]
    assert [json.loads(fake.hget(ks.records, m).decode().split(":", 1)[1])[0]
            for m in members] == list(range(200))


def test_a_forked_child_starts_its_own_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a fork does to the id sequence, without forking (a real fork:
    tests/integration/test_fork.py): the module registers its sequence's reset to run in
    the child, and a reset sequence, at the same millisecond as its parent, makes other ids."""
    registered: list[dict[str, Any]] = []
    monkeypatch.setattr(os, "register_at_fork", lambda **hooks: registered.append(hooks))
    spec = importlib.util.spec_from_file_location("fresh_timer_ids", timer_ids_module.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert registered == [{"after_in_child": fresh._SEQUENCE.reset}]

    parent = IdSequence(lambda: 1_700_000_000_000)
    parent.next()
    twin, child = IdSequence(parent.wall_ms), IdSequence(parent.wall_ms)
    for copy in (twin, child):  # what fork copies: the last millisecond and its counter
        copy._last_ms, copy._counter = parent._last_ms, parent._counter
    child.reset()  # what the fork hook does in the child
    parents = [parent.next() for _ in range(50)]
    assert [twin.next() for _ in range(50)] == parents, "without the reset: the same ids"
    assert not set(parents) & {child.next() for _ in range(50)}


def test_schedule_writes_one_expiring_key_named_by_the_timer(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    tid = producer.schedule("reminders.sms", [7, "hi"], in_=FAR)
    (key,) = timer_keys(fake)
    assert key == f'timers:{tid}:reminders.sms:[7,"hi"]'
    assert 0 < fake.pttl(key) <= FAR * 1000
    assert index_sizes(fake) == (1, 1)


def test_tuple_args_arrive_as_a_list(producer: Timers) -> None:
    tid = producer.schedule("a.b", (1, "x"), in_=FAR)
    timer = producer.get(tid)
    assert timer is not None and timer.args == [1, "x"]


def test_schedule_at_an_aware_datetime(producer: Timers) -> None:
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
    tid = producer.schedule("a.b", at=at)
    timer = producer.get(tid)
    assert timer is not None and timer.due == at


def test_get_unknown_id_is_none(producer: Timers) -> None:
    assert producer.get("nope") is None


@pytest.mark.usefixtures("every_timer_near")
def test_same_explicit_id_replaces_the_pending_timer(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    assert producer.schedule("a.first", [1], in_=FAR, id="order-7") == "order-7"
    assert producer.schedule("a.second", {"n": 2}, in_=2 * FAR, id="order-7") == "order-7"

    timer = producer.get("order-7")
    assert timer is not None
    assert (timer.task, timer.args) == ("a.second", {"n": 2})
    assert index_sizes(fake) == (1, 1)
    assert timer_keys(fake) == ['timers:order-7:a.second:{"n":2}']
    assert fake.pttl('timers:order-7:a.second:{"n":2}') > FAR * 1000


@pytest.mark.usefixtures("every_timer_near")
def test_same_id_same_record_moves_the_key_expiry(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], in_=FAR, id="x")
    producer.schedule("a.b", [1], in_=10 * FAR, id="x")
    assert timer_keys(fake) == ["timers:x:a.b:[1]"]
    assert fake.pttl("timers:x:a.b:[1]") > 9 * FAR * 1000


def test_a_generated_id_never_overwrites_a_pending_timer(
    producer: Timers, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = iter(["fixed-id", "fixed-id", "fresh-id"])
    monkeypatch.setattr(timers.ops.operations, "new_timer_id", lambda: next(ids))

    first = producer.schedule("a.first", [1], in_=FAR)
    second = producer.schedule("a.second", [2], in_=FAR)

    assert (first, second) == ("fixed-id", "fresh-id")
    kept = producer.get("fixed-id")
    assert kept is not None and (kept.task, kept.args) == ("a.first", [1])
    new = producer.get("fresh-id")
    assert new is not None and (new.task, new.args) == ("a.second", [2])
    assert producer.stats().pending == 2


@pytest.fixture(params=["straight", "driven"])
def lone_schedule(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a lone ``schedule`` runs once the prefix's one shard is known: its steps taken
    straight (``Timers._schedule_one``), or its operation driven by ``run`` (the way of a
    sharded prefix and of a call that waits for replicas)."""
    if request.param == "driven":
        monkeypatch.setattr(timers.ops.sharded.ShardedOperations, "single",
                            property(lambda self: None))
    return str(request.param)


def test_a_lone_schedule_retries_a_taken_id_and_raises_as_run_does(
    producer: Timers, fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch,
    lone_schedule: str,
) -> None:
    producer.schedule("a.b", in_=FAR, id="first")  # (the layout is read)
    assert (producer.ops.single is None) == (lone_schedule == "driven")
    ids = itertools.chain(["taken", "taken", "fresh"], map(str, itertools.count()))
    monkeypatch.setattr(timers.ops.operations, "new_timer_id", lambda: next(ids))
    assert [producer.schedule("a.b", [n], in_=FAR) for n in (1, 2)] == ["taken", "fresh"]
    pending = producer.get("taken")
    assert pending is not None and pending.args == [1]

    def refuse(**_: Any) -> Any:
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > "
                                                "'maxmemory'.")

    monkeypatch.setitem(producer._scripts, "schedule", refuse)
    with pytest.raises(ServerOutOfMemory, match="out of memory") as full:
        producer.schedule("a.b", in_=FAR)
    assert full.value.written == []
    assert isinstance(full.value.__cause__, redis.exceptions.OutOfMemoryError)

    def lost(**_: Any) -> Any:
        raise redis.exceptions.ConnectionError("Connection closed by server.")

    monkeypatch.setitem(producer._scripts, "schedule", lost)
    with pytest.raises(ServerUnavailable) as gone:
        producer.schedule("a.b", in_=FAR)
    assert isinstance(gone.value.__cause__, redis.exceptions.ConnectionError)
    assert producer.stats().pending == 3


# -- cancel and reschedule ---------------------------------------------------------------


def test_cancel_removes_everything_once(producer: Timers, fake: fakeredis.FakeRedis) -> None:
    tid = producer.schedule("a.b", [1], in_=FAR)
    other = producer.schedule("a.b", [2], in_=FAR)

    assert producer.cancel(tid) is True
    assert producer.cancel(tid) is False
    assert producer.get(tid) is None
    assert timer_keys(fake) == [f"timers:{other}:a.b:[2]"]
    assert index_sizes(fake) == (1, 1)


def test_cancel_unknown_id_is_false(producer: Timers) -> None:
    assert producer.cancel("never-scheduled") is False


@pytest.mark.usefixtures("every_timer_near")
def test_reschedule_moves_the_due_time_and_the_key(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    tid = producer.schedule("a.b", [1], in_=FAR)
    before = redis_now_ms(fake)
    assert producer.reschedule(tid, in_=10 * FAR) is True
    timer = producer.get(tid)
    assert timer is not None and (timer.task, timer.args) == ("a.b", [1])
    assert ms(timer.due) >= before + 10 * FAR * 1000
    (key,) = timer_keys(fake)
    assert fake.pttl(key) > 9 * FAR * 1000


def test_reschedule_to_an_absolute_time(producer: Timers) -> None:
    tid = producer.schedule("a.b", in_=FAR)
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    assert producer.reschedule(tid, at=at) is True
    timer = producer.get(tid)
    assert timer is not None and timer.due == at


def test_reschedule_into_the_past_drops_the_key_and_stays_pending(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    tid = producer.schedule("a.b", [1], in_=FAR)
    assert producer.reschedule(tid, in_=-1) is True
    assert timer_keys(fake) == []
    assert producer.get(tid) is not None
    assert claim(register_all(fake), ks).entries == [f"{tid}:a.b:[1]"]


def test_reschedule_unknown_id_is_false_and_creates_nothing(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    assert producer.reschedule("ghost", in_=5) is False
    assert fake.keys("*") == []


def test_reschedule_after_cancel_is_false(producer: Timers) -> None:
    tid = producer.schedule("a.b", in_=FAR)
    producer.cancel(tid)
    assert producer.reschedule(tid, in_=5) is False
    assert producer.get(tid) is None


# -- many, list, stats -------------------------------------------------------------------


def test_schedule_many_returns_ids_in_order(producer: Timers) -> None:
    specs: list[TimerSpec | dict[str, Any]] = [
        TimerSpec("a.one", [1], in_=FAR),
        {"task": "a.two", "args": {"k": 2}, "in_": 2 * FAR},
        TimerSpec("a.three", None, in_=3 * FAR, id="third"),
    ]
    ids = producer.schedule_many(specs)
    assert len(ids) == 3 and ids[2] == "third"
    got = [producer.get(i) for i in ids]
    assert [(t.task, t.args) for t in got if t is not None] == [
        ("a.one", [1]), ("a.two", {"k": 2}), ("a.three", None)]


def test_schedule_many_beyond_one_batch(producer: Timers, fake: fakeredis.FakeRedis) -> None:
    count = 2 * SCHEDULE_CHUNK + 1
    ids = producer.schedule_many(TimerSpec("a.b", [i], in_=FAR) for i in range(count))
    assert len(set(ids)) == count
    assert producer.stats().pending == count
    assert len(fake.keys("timers:*")) == count
    last = producer.get(ids[-1])
    assert last is not None and last.args == [count - 1]


def test_schedule_many_with_one_bad_spec_schedules_nothing(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    with pytest.raises(InvalidTask):
        producer.schedule_many([TimerSpec("a.ok", in_=FAR), TimerSpec("bad..task", in_=FAR)])
    with pytest.raises(InvalidTimer, match="spec"):
        producer.schedule_many([{"task": "a.ok", "in_": FAR, "when": 5}])
    assert fake.keys("*") == []


def test_list_is_soonest_first_and_limited(producer: Timers) -> None:
    late = producer.schedule("a.late", in_=3 * FAR)
    soon = producer.schedule("a.soon", in_=FAR)
    mid = producer.schedule("a.mid", in_=2 * FAR)
    assert [t.id for t in producer.list()] == [soon, mid, late]
    assert [t.task for t in producer.list(limit=2)] == ["a.soon", "a.mid"]
    assert producer.list(limit=0) == []


def test_stats_count_pending(producer: Timers) -> None:
    assert producer.stats().pending == 0
    ids = [producer.schedule("a.b", in_=FAR) for _ in range(3)]
    producer.cancel(ids[0])
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.failed, stats.fired) == (2, 0, 0, 0)


# -- invalid input leaves nothing behind -------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: t.schedule("..", in_=5), InvalidTask),
        (lambda t: t.schedule("__import__", in_=5), InvalidTask),
        (lambda t: t.schedule("os..system", in_=5), InvalidTask),
        (lambda t: t.schedule(5, in_=5), InvalidTask),
        (lambda t: t.schedule("a.b", 5, in_=5), InvalidArgs),
        (lambda t: t.schedule("a.b", {1: 2}, in_=5), InvalidArgs),
        (lambda t: t.schedule("a.b", [{1, 2}], in_=5), InvalidArgs),
        (lambda t: t.schedule("a.b", [float("nan")], in_=5), InvalidArgs),
        (lambda t: t.schedule("a.b"), InvalidDueTime),
        (lambda t: t.schedule("a.b", in_=5, at=datetime.now(UTC)), InvalidDueTime),
        (lambda t: t.schedule("a.b", at=datetime(2030, 1, 1)), InvalidDueTime),
        (lambda t: t.schedule("a.b", in_=float("inf")), InvalidDueTime),
        (lambda t: t.schedule("a.b", in_=True), InvalidDueTime),
        (lambda t: t.schedule("a.b", in_=5, id=""), InvalidTimerId),
        (lambda t: t.schedule("a.b", in_=5, id=7), InvalidTimerId),
        (lambda t: t.schedule("a.b", in_=5, id="x" * 600), InvalidTimerId),
        (lambda t: t.reschedule("", in_=5), InvalidTimerId),
        (lambda t: t.cancel(""), InvalidTimerId),
    ],
)
def test_invalid_input_raises_and_leaves_redis_untouched(
    producer: Timers,
    fake: fakeredis.FakeRedis,
    call: Callable[[Timers], Any],
    error: type[InvalidTimer],
) -> None:
    with pytest.raises(error):
        call(producer)
    assert fake.keys("*") == []


def test_a_due_time_redis_cannot_store_is_refused_before_anything_is_written(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], in_=FAR, id="victim")
    snapshot = {k: fake.dump(k) for k in fake.keys("*")}

    with pytest.raises(InvalidDueTime):
        producer.schedule("a.b", [2], in_=1e20, id="victim")
    with pytest.raises(InvalidDueTime):
        producer.schedule("a.b", [3], in_=1e20)

    assert {k: fake.dump(k) for k in fake.keys("*")} == snapshot
    victim = producer.get("victim")
    assert victim is not None and victim.args == [1]


@pytest.mark.parametrize("in_", [-1e20, -1e15])
def test_an_accepted_past_due_time_never_breaks_reading_timers(
    producer: Timers, in_: float
) -> None:
    """Refusing an absurd past is fine; accepting it and then failing every list() is not."""
    other = producer.schedule("a.b", [0], in_=FAR)
    try:
        tid = producer.schedule("a.b", [1], in_=in_)
    except InvalidDueTime:
        assert [t.id for t in producer.list()] == [other]
        return
    timer = producer.get(tid)
    assert timer is not None and timer.args == [1]
    assert [t.id for t in producer.list()] == [tid, other]


def test_args_over_the_configured_limit(fake: fakeredis.FakeRedis) -> None:
    small = Timers(fake, max_args_bytes=100)
    with pytest.raises(InvalidArgs, match=r"limit of 100"):
        small.schedule("a.b", ["x" * 100], in_=5)
    assert fake.keys("*") == []
    tid = small.schedule("a.b", ["x" * 90], in_=5)
    assert small.get(tid) is not None


# -- due times in the past ---------------------------------------------------------------


def test_past_due_time_has_no_key_but_is_pending_and_claimable(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    tid = producer.schedule("a.b", [1], in_=-5)
    assert timer_keys(fake) == []
    timer = producer.get(tid)
    assert timer is not None and timer.seconds_left(datetime.now(UTC)) < 0
    reply = claim(register_all(fake), ks)
    assert reply.entries == [f"{tid}:a.b:[1]"]
    assert [c.source for c in reply.claimed] == ["s"]


def test_replacing_with_a_past_due_time_drops_the_old_key(
    producer: Timers, fake: fakeredis.FakeRedis
) -> None:
    producer.schedule("a.b", [1], in_=FAR, id="x")
    producer.schedule("a.b", [1], at=datetime(2001, 1, 1, tzinfo=UTC), id="x")
    assert timer_keys(fake) == []
    producer.schedule("a.b", [2], in_=FAR, id="y")
    producer.schedule("a.c", [3], in_=-1, id="y")
    assert timer_keys(fake) == []
    assert producer.stats().pending == 2


@pytest.fixture
def bounded_new_ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fresh ids that run out after 20, so a retry loop fails instead of hanging."""
    made: list[str] = []
    counter = itertools.count()

    def new_id() -> str:
        n = next(counter)
        if n >= 20:
            raise AssertionError(f"schedule asked for {n + 1} generated ids")
        made.append(f"gen-{n}")
        return made[-1]

    monkeypatch.setattr(timers.ops.operations, "new_timer_id", new_id)
    yield made


def test_a_due_time_before_the_epoch_is_refused_and_nothing_is_written(
    producer: Timers, fake: fakeredis.FakeRedis, bounded_new_ids: list[str]
) -> None:
    just_before_epoch = datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    with pytest.raises(InvalidDueTime, match="before 1970"):
        producer.schedule("a.b", at=just_before_epoch, id="mine")
    with pytest.raises(InvalidDueTime, match="before 1970"):
        producer.schedule_many([TimerSpec("a.b", in_=1), TimerSpec("a.b", at=just_before_epoch)])
    assert fake.keys("*") == []


def test_reschedule_to_before_the_epoch_is_refused(producer: Timers) -> None:
    tid = producer.schedule("a.b", in_=FAR)
    before = producer.get(tid)
    just_before_epoch = datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    with pytest.raises(InvalidDueTime, match="before 1970"):
        producer.reschedule(tid, at=just_before_epoch)
    assert producer.get(tid) == before


def test_in_far_in_the_past_counts_as_the_epoch(producer: Timers) -> None:
    tid = producer.schedule("a.b", in_=-99 * 365 * 86400.0)
    timer = producer.get(tid)
    assert timer is not None and timer.due == datetime(1970, 1, 1, tzinfo=UTC)
    assert producer.reschedule(tid, in_=-99 * 365 * 86400.0) is True


# -- wake-ups for listeners --------------------------------------------------------------


def test_only_a_new_earliest_timer_publishes_a_wake(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace
) -> None:
    pubsub = fake.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(ks.wake_channel)

    first = producer.schedule("a.b", in_=FAR)  # nothing pending: wake
    first_due = producer.get(first)
    producer.schedule("a.b", in_=2 * FAR)  # later than the head: no wake
    earlier = producer.schedule("a.b", in_=FAR / 2)  # new head: wake
    producer.reschedule(first, in_=FAR / 4)  # moved before the head: wake
    producer.reschedule(earlier, in_=3 * FAR)  # moved later: no wake

    published = []
    while (message := pubsub.get_message(timeout=0.01)) is not None:
        if message["type"] == "message":
            published.append(int(message["data"]))
    pubsub.close()
    assert first_due is not None
    moved_first = producer.get(first)
    assert moved_first is not None
    assert published == [ms(first_due.due), published[1], ms(moved_first.due)]
    assert ms(first_due.due) - FAR / 2 * 1000 - 50 <= published[1] <= ms(first_due.due)


# -- ids and args with separators --------------------------------------------------------


@pytest.mark.parametrize("tid", ["user:42:reminder", "100%", "%3A", "a:%25:b", "é😀:|;"])
def test_ids_with_colons_and_percent_work_end_to_end(
    producer: Timers, fake: fakeredis.FakeRedis, ks: Keyspace, tid: str
) -> None:
    args = {"note": "a:b;c|d%e"}
    assert producer.schedule("a.b", args, in_=FAR, id=tid) == tid
    timer = producer.get(tid)
    assert timer is not None and (timer.id, timer.args) == (tid, args)
    assert [t.id for t in producer.list()] == [tid]

    (key,) = fake.keys("timers:*")
    entry = Entry.decode(as_text(key)[len(ks.timer_key_start):])
    assert (entry.id, entry.record.args) == (tid, args)

    assert producer.reschedule(tid, in_=-1) is True
    reply = claim(register_all(fake), ks)
    assert len(reply.claimed) == 1
    assert Entry.decode(reply.claimed[0].entry).id == tid

    producer.schedule("a.b", args, in_=FAR, id=tid)
    assert producer.cancel(tid) is True
    assert fake.keys("timers:*") == []


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tid=timer_ids.filter(lambda t: not is_occurrence_id(t)), args=json_args)
def test_any_id_and_args_round_trip_through_redis(tid: str, args: Any) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    producer = Timers(client)
    producer.schedule("jobs.run", args, in_=FAR, id=tid)
    timer = producer.get(tid)
    assert timer is not None and (timer.id, timer.args) == (tid, args)
    (key,) = client.keys("timers:*")
    entry = Entry.decode(as_text(key)[len("timers:"):])
    assert (entry.id, entry.record.task, entry.record.args) == (tid, "jobs.run", args)
    assert producer.cancel(tid) is True
    # only its history record is left (with its task's index, and the sequence that named
    # its batch): the timer is gone
    assert sorted(client.keys("*")) == [b"timers|hist", b"timers|histb", b"timers|histexp",
                                        b"timers|histrec", b"timers|hist|n|jobs.run",
                                        b"timers|seq"]
    ended = producer.status(tid)
    assert (ended.state, ended.ended is not None and ended.ended.id) == ("cancelled", tid)


# -- asyncio -----------------------------------------------------------------------------


def test_async_timers_basic_flow() -> None:
    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        async with AsyncTimers(client) as producer:
            tid = await producer.schedule("reminders.sms", {"user_id": 1}, in_=FAR)
            timer = await producer.get(tid)
            assert timer is not None and (timer.task, timer.args) == (
                "reminders.sms", {"user_id": 1})

            assert await producer.schedule("a.b", [1], in_=FAR, id="x:1") == "x:1"
            assert await producer.schedule("a.c", [2], in_=2 * FAR, id="x:1") == "x:1"
            replaced = await producer.get("x:1")
            assert replaced is not None and (replaced.task, replaced.args) == ("a.c", [2])

            assert await producer.reschedule("x:1", in_=FAR / 2) is True
            assert await producer.reschedule("ghost", in_=1) is False
            assert [t.id for t in await producer.list()] == ["x:1", tid]

            ids = await producer.schedule_many(
                [TimerSpec("a.b", [i], in_=FAR) for i in range(3)])
            assert len(ids) == 3
            assert (await producer.stats()).pending == 5

            assert await producer.cancel(tid) is True
            assert await producer.cancel(tid) is False
            assert await producer.get(tid) is None
            assert (await producer.stats()).pending == 4
            assert await producer.failed() == []

            with pytest.raises(InvalidTask):
                await producer.schedule("..", in_=1)
        assert len(await client.keys("timers:*")) == 4
        await client.aclose()

    asyncio.run(scenario())


def test_async_schedule_many_beyond_one_batch() -> None:
    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        producer = AsyncTimers(client)
        count = SCHEDULE_CHUNK + 1
        ids = await producer.schedule_many(TimerSpec("a.b", [i], in_=FAR) for i in range(count))
        assert len(set(ids)) == count
        assert (await producer.stats()).pending == count
        await client.aclose()

    asyncio.run(scenario())


def test_generated_ids_spell_their_time_and_counter_in_the_ordered_alphabet() -> None:
    """The one-pass encoding gives the digits a plain base-64 loop gives, in order."""
    import random

    from timers.model.timer_ids import ALPHABET, COUNTER_CHARS, TIME_CHARS, id_text

    def digits(value: int, width: int) -> str:
        out = ""
        for _ in range(width):
            value, digit = divmod(value, 64)
            out = ALPHABET[digit] + out
        return out

    rng = random.Random(7)
    cases = [(0, 0), ((1 << 42) - 1, (1 << 42) - 1), (1_795_000_000_000, 1)]
    cases += [(rng.randrange(1 << 42), rng.randrange(1 << 42)) for _ in range(1_000)]
    for ms, counter in cases:
        assert id_text(ms, counter) == digits(ms, TIME_CHARS) + digits(counter, COUNTER_CHARS)
    assert sorted(id_text(ms, c) for ms, c in cases) == [id_text(ms, c) for ms, c in sorted(cases)]
