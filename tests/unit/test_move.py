"""``timers move`` and ``lua/move.lua`` on fakeredis: timers of chosen tasks change prefix,
each gone from the old one only as it is written to the new one."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import fakeredis
import pytest
import redis

from timers import Timers
from timers.cli.move import _tag, summary_line
from timers.model import run_record
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.model.wire import FailureRecord
from timers.ops.base import Operation
from timers.ops.moves import MoveSummary, move_all, move_timers
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
    for bad in (scripts.calls.move(OLD, [], False, OLD.due, 10),  # onto itself
                scripts.calls.move(NEW, [], False, OLD.due, 0),  # an empty page
                scripts.calls.move(NEW, [], False, OLD.due, 10, ("soon", "a"))):
        with pytest.raises(redis.ResponseError, match="timers move: bad arguments"):
            scripts.run(bad)
    assert sorted(fake.keys("*")) == before


def test_on_a_cluster_two_prefixes_share_a_script_only_with_one_hash_tag() -> None:
    assert _tag("timers") == "timers" and _tag("mail") == "mail"
    assert _tag("app:{x}") == _tag("mail:{x}") == "x"


def test_timers_a_flow_gate_holds_are_left_and_counted(fake: fakeredis.FakeRedis) -> None:
    with Timers(fake, prefix="old") as old:
        old.schedule("mail.send", [1], in_=60, id="free")
        old.schedule("mail.send", [2], in_=60, id="held")
        old.schedule("billing.charge", [3], in_=60, id="other")
        old.schedule("mail.send", [4], in_=60, id="promoted")
    for held in ("held", "other"):  # as a gate leaves them: out of the due index, parked
        fake.zrem(OLD.due, held)
        fake.hset(OLD.parked, held, "k|1|0|0|device")
    fake.hset(OLD.parked, "promoted", "C|1|0|0|device")  # pending, its slot kept here
    done = Timers(fake, prefix="old").run(move_timers(OLD, NEW, ["mail.send"]))
    assert (done.moved, done.held) == (1, 2)
    assert fake.hexists(OLD.records, "held") and fake.hexists(NEW.records, "free")
    assert fake.zscore(OLD.due, "promoted") is not None


# -- a walk that removals cannot shift (issue 45, finding 4) -----------------------------

T = TypeVar("T")


def meanwhile(op: Operation[T], step: Callable[[], None]) -> Operation[T]:
    """``op``, with ``step`` (what listeners and producers do meanwhile) run before each
    of its round trips."""
    request = next(op)
    while True:
        step()
        reply = yield request
        try:
            request = op.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result


def mail_left(t: Timers) -> list[str]:
    return sorted(i for i, task in pending(t).items() if task == "mail.send")


def test_timers_removed_ahead_of_the_cursor_between_pages_make_the_walk_skip_none(
        fake: fakeredis.FakeRedis) -> None:
    """The old prefix's listener claims its own due timers, and producers cancel others
    due among the mail timers, while the move walks the index a page at a time: every
    mail timer moves, each once; a second move finds nothing left."""
    scripts, rng = Scripts(fake, OLD), random.Random(45)
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        old.schedule_many([TimerSpec("own.mark", [i], in_=0, id=f"own{i:03d}")
                           for i in range(300)])
        specs = [TimerSpec("mail.send", [i], in_=60 + i / 100, id=f"m{i:03d}")
                 for i in range(700)]
        specs += [TimerSpec("other.task", [i], in_=60 + i / 100, id=f"x{i:03d}")
                  for i in range(700)]
        old.schedule_many(specs)
        due = {p.id: p.due for p in old.list(limit=10_000)}
        others = [f"x{i:03d}" for i in range(700)]
        rng.shuffle(others)

        def listeners_and_producers() -> None:
            scripts.claim(limit=20, lease_ms=15_000, horizon_ms=0, listener_id="own",
                          groups=("default",))
            for _ in range(20):
                if others:
                    assert old.cancel(others.pop())

        done = old.run(meanwhile(move_timers(OLD, NEW, ["mail.send"], page=50),
                                 listeners_and_producers))
        assert (done.moved, done.held, done.taken) == (700, 0, 0)
        assert mail_left(old) == []
        moved = {p.id: p.due for p in new.list(limit=10_000)}
        assert moved == {f"m{i:03d}": due[f"m{i:03d}"] for i in range(700)}
        again = old.run(move_timers(OLD, NEW, ["mail.send"], page=50))
        assert (again.moved, again.held, again.taken) == (0, 0, 0)
        assert len(new.list(limit=10_000)) == 700


def test_a_walk_past_timers_it_leaves_reads_each_page_once(
        fake: fakeredis.FakeRedis) -> None:
    """Timers of other tasks stay where they are, ahead of the ones that move: the
    cursor goes past them, so a walk of N entries takes a call or two per page and ends (a walk
    that started each page over from the head would read the same timers it leaves, for
    ever). (A page whose timers' keys must be declared first is two calls.)"""
    calls = [0]

    def counted() -> None:
        calls[0] += 1
        assert calls[0] <= 30, "the walk reads the same page again and again"

    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        old.schedule_many([TimerSpec("other.task", [i], in_=60 + i, id=f"x{i:03d}")
                           for i in range(40)])
        old.schedule_many([TimerSpec("mail.send", [i], in_=100 + i, id=f"m{i:03d}")
                           for i in range(20)])
        done = old.run(meanwhile(move_timers(OLD, NEW, ["mail.send"], page=7), counted))
        assert done.moved == 20 and mail_left(old) == []
        assert len(new.list(limit=1_000)) == 20 and len(old.list(limit=1_000)) == 40
        assert calls[0] <= 2 * (60 // 7 + 1)


def test_timers_of_one_due_time_are_walked_by_member_past_removals(
        fake: fakeredis.FakeRedis) -> None:
    """Timers scheduled in one call share their due time (one score): the cursor goes on
    by member within it, however many entries before it go meanwhile."""
    at = datetime.now(UTC) + timedelta(minutes=5)
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        specs = [TimerSpec("mail.send" if i % 2 else "other.task", [i], at=at,
                           id=f"t{i:04d}") for i in range(600)]
        rng = random.Random(4)
        rng.shuffle(specs)
        old.schedule_many(specs)
        assert len({p.due for p in old.list(limit=1_000)}) == 1, "one due time"
        others = sorted(f"t{i:04d}" for i in range(0, 600, 2))

        def cancel_passed() -> None:
            if others:  # the lowest member first: one the walk has passed already
                assert old.cancel(others.pop(0))

        done = old.run(meanwhile(move_timers(OLD, NEW, ["mail.send"], page=7),
                                 cancel_passed))
        assert done.moved == 300 and mail_left(old) == []
        assert len(new.list(limit=1_000)) == 300


def test_runs_in_flight_under_the_old_prefix_are_moved_when_they_come_back(
        fake: fakeredis.FakeRedis) -> None:
    """Timers the old prefix's listener claimed before the walk reached them are waited
    for: a run handed back, or ended in a retry, is pending again and moved by the next
    walk; one that completes there is not left; one still running when the wait is over
    is left and counted, and a later move takes it once it is pending again."""
    scripts = Scripts(fake, OLD)
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        old.schedule_many([TimerSpec("mail.send", [i], in_=0, id=f"m{i}") for i in range(4)])
        old.schedule_many([TimerSpec("mail.send", [i], in_=60, id=f"l{i}")
                           for i in range(20)])
        reply = scripts.claim(limit=10, lease_ms=60_000, horizon_ms=0, listener_id="old",
                              groups=("default",))[3:]
        tokens = [as_text(token) for token in reply[0::3]]
        entries = {as_text(token): "{3}:{4}".format(*run_record.decode(as_text(run)))
                   for token, run in zip(reply[0::3], reply[1::3], strict=True)}
        assert len(tokens) == 4
        clock = [0.0]
        endings = [[(tokens[0], "release", "0", "")], [(tokens[1], "ok", "", "")],
                   [(tokens[2], "retry", entries[tokens[2]], "1000")], []]

        def listener_meanwhile(seconds: float) -> None:
            clock[0] += seconds
            if endings:
                ending = endings.pop(0)
                if ending:
                    scripts.finish(retention_ms=1000, endings=ending)

        done = move_all(old.run, OLD, NEW, ["mail.send"], wait=10, sleep=listener_meanwhile,
                        clock=lambda: clock[0])
        assert (done.moved, done.running, done.left) == (22, 1, 1)
        assert sorted(pending(new)) == sorted([f"l{i}" for i in range(20)] + ["m0", "m2"])
        assert mail_left(old) == []
        scripts.finish(retention_ms=1000, endings=[(tokens[3], "release", "0", "")])
        again = move_all(old.run, OLD, NEW, ["mail.send"], wait=10)
        assert (again.moved, again.left) == (1, 0) and "m3" in pending(new)


def test_a_run_claimed_while_the_first_walk_went_is_waited_for_and_moved(
        fake: fakeredis.FakeRedis) -> None:
    """Nothing was in flight when the move began, but the old prefix's listener claimed a
    timer as the first walk started: the walk did not see it pending, so the move waits
    for it (it comes back pending here, handed back) and the next walk moves it. Never a
    summary of nothing left while a run it did not move is still out."""
    scripts = Scripts(fake, OLD)
    with Timers(fake, prefix="old") as old, Timers(fake, prefix="new") as new:
        old.schedule("mail.send", [0], in_=0, id="m0")
        claimed: list[str] = []

        def listener_claims() -> None:
            if not claimed:
                reply = scripts.claim(limit=10, lease_ms=60_000, horizon_ms=0,
                                      listener_id="old", groups=("default",))[3:]
                claimed.extend(as_text(token) for token in reply[0::3])

        walks = [0]

        def run(op: Operation[T]) -> T:
            walks[0] += 1
            return old.run(meanwhile(op, listener_claims) if walks[0] == 2 else op)

        def listener_hands_back(seconds: float) -> None:
            scripts.finish(retention_ms=1000, endings=[(claimed[0], "release", "0", "")])

        done = move_all(run, OLD, NEW, ["mail.send"], wait=10, sleep=listener_hands_back)
        assert len(claimed) == 1
        assert (done.moved, done.left) == (1, 0) and "m0" in pending(new)
        assert mail_left(old) == []


def test_the_summary_says_what_was_moved_and_what_was_left_and_why() -> None:
    done = MoveSummary(moved=4990, dead_moved=7, held=3, taken=2, running=5)
    assert summary_line(done, "app", "mail", dead=True) == (
        "moved 4990 pending timer(s) and 7 dead one(s) from 'app' to 'mail', left 10 "
        "(held by a concurrency key or rate limit: 3, id taken under 'mail': 2, still "
        "running under 'app': 5); run it again to move those that are pending by then")
    assert summary_line(MoveSummary(moved=5000), "app", "mail", dead=False) == (
        "moved 5000 pending timer(s) from 'app' to 'mail', left 0")
