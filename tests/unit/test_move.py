"""``timers move`` and ``lua/move.lua`` on fakeredis: timers of chosen tasks change prefix,
each gone from the old one only as it is written to the new one."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from timers import Timers
from timers.cli.move import _tag
from timers.model.keys import Keyspace
from timers.model.wire import FailureRecord
from timers.ops.moves import move_timers
from timers.ops.operations import TimerSpec
from timers.store.scripts import Scripts

OLD, NEW = Keyspace("old"), Keyspace("new")


def pending(t: Timers) -> dict[str, str]:
    return {p.id: p.task for p in t.list(limit=10_000)}


def dead_record(fake: fakeredis.FakeRedis, timer_id: str, task: str, at: int) -> str:
    failure_id = f"{timer_id}:9"
    record = FailureRecord("refused", "TaskRefused", "no such task", at, id=timer_id, task=task)
    fake.hset(OLD.failure_records, failure_id, record.to_json())
    fake.zadd(OLD.failures, {failure_id: at})
    fake.zadd(OLD.failure_index, {failure_id: 0})
    return failure_id


def test_the_pending_timers_of_the_chosen_tasks_move_with_their_due_time_and_group(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        old.schedule_many([TimerSpec("mail.send", [i], in_=60, id=f"m{i}") for i in range(7)])
        old.schedule("mail.send", [9], in_=30, id="g1", group="bulk", priority=5)
        old.schedule("billing.charge", [1], in_=60, id="b1")
        due = {p.id: p.due for p in old.list()}
        done = old.run(move_timers(OLD, NEW, ["mail.send"], page=3))
        assert (done.moved, done.held, done.taken) == (8, 0, 0)
        assert pending(old) == {"b1": "billing.charge"}
        moved = {p.id: p for p in new.list()}
        assert set(moved) == {f"m{i}" for i in range(7)} | {"g1"}
        assert {i: p.due for i, p in moved.items()} == {i: due[i] for i in moved}
        assert (moved["g1"].group, moved["g1"].priority) == ("bulk", 5)
    keys = {k.decode() for k in fake.keys("old:*")}
    assert keys == {k for k in keys if ":b1:" in k}, "the moved timers' expiring keys went"
    assert len(fake.keys("new:*")) == 8, "each moved timer has its expiring key"


def test_a_timer_whose_id_the_new_prefix_has_stays_and_is_counted(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        old.schedule("mail.send", [1], in_=60, id="same")
        old.schedule("mail.send", [2], in_=60, id="other")
        new.schedule("mail.send", [3], in_=60, id="same")
        done = old.run(move_timers(OLD, NEW))
        assert (done.moved, done.taken) == (1, 1)
        assert pending(old) == {"same": "mail.send"}
        assert new.get("same") is not None and new.get("same").args == [3]  # type: ignore[union-attr]


def test_dead_timers_of_the_chosen_tasks_move_with_dead(fake: fakeredis.FakeRedis) -> None:
    mail = dead_record(fake, "d1", "mail.send", 1000)
    bill = dead_record(fake, "d2", "billing.charge", 2000)
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        done = old.run(move_timers(OLD, NEW, ["mail.send"], dead=True))
        assert done.dead_moved == 1
        assert [f.failure_id for f in new.failed()] == [mail]
        assert [f.failure_id for f in old.failed()] == [bill]
        assert [f.failure_id for f in new.get_failures("d1")] == [mail]
    assert fake.zscore(NEW.failures, mail) == 1000
    assert fake.zscore(NEW.failure_index, mail) == 0


def test_bad_move_arguments_write_nothing(fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, prefix="old") as old:
        old.schedule("mail.send", [1], in_=60, id="a")
    before = sorted(fake.keys("*"))
    scripts = Scripts(fake, OLD)
    with pytest.raises(redis.ResponseError, match="timers move"):
        scripts.run(scripts.calls.move(OLD, [], False, ["a"]))  # onto itself
    with pytest.raises(redis.ResponseError, match="timers move"):
        scripts.run(scripts.calls.move(NEW, [], False, ["a", ""]))
    assert sorted(fake.keys("*")) == before


def test_on_a_cluster_two_prefixes_share_a_script_only_with_one_hash_tag() -> None:
    assert _tag("timers") == "timers" and _tag("mail") == "mail"
    assert _tag("app:{x}") == _tag("mail:{x}") == "x"


def test_timers_a_flow_gate_holds_are_left_and_counted(fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, prefix="old") as old:
        old.schedule("mail.send", [1], in_=60, id="free")
        old.schedule("mail.send", [2], in_=60, id="held")
        old.schedule("billing.charge", [3], in_=60, id="other")
    for held in ("held", "other"):  # as a gate leaves them: out of the due index, parked
        fake.zrem(OLD.due, held)
        fake.hset(OLD.parked, held, "k|1|0|0|device")
    done = Timers(fake, prefix="old").run(move_timers(OLD, NEW, ["mail.send"]))
    assert (done.moved, done.held) == (1, 1)
    assert fake.hexists(OLD.records, "held") and fake.hexists(NEW.records, "free")
