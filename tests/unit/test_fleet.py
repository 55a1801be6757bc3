"""Listeners announce what they can run; one that lacks a task hands its timers back for a
live listener that has it (:mod:`timers.ops.fleet`, ``lua/heartbeat.lua``, the executor)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import fakeredis
import pytest
import redis

from tests.unit.test_listener_parts import REDIS_NOW_MS, executor_of
from timers import Timers
from timers.listener.calling.runner import Runner
from timers.listener.endings.ending import Ending
from timers.listener.finding.events import Rejected
from timers.listener.finding.rejected import RejectedKeys
from timers.listener.health.peers import Peers
from timers.model.encoding import Record
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.model.wire import EndingKind, Option
from timers.ops.base import Operation
from timers.ops.fleet import (
    HAND_OVER_FIRST_MS,
    HAND_OVER_MAX_MS,
    FleetView,
    Peer,
    encode_task_set,
    fleet_calls,
    hand_over_delay_ms,
    handed_back,
    handed_over,
    read_fleet,
    task_set_digest,
)
from timers.store.scripts import Scripts

KEYS = Keyspace()


def drive(fake: fakeredis.FakeRedis, operation: Operation[Any]) -> Any:
    """Run a sans-I/O operation of plain commands on fakeredis."""
    request = next(operation)
    try:
        while True:
            request = operation.send([fake.execute_command(*c.command) for c in request])
    except StopIteration as done:
        return done.value


def beat(scripts: Scripts, me: str, package: str, tasks: list[str], send: bool = True,
         groups: tuple[str, ...] = ("default",)) -> None:
    digest = task_set_digest(tasks)
    info = json.dumps({"id": me, "tasks": package, "groups": list(groups), "task_set": digest})
    scripts.heartbeat(me, 30_000, info, digest, encode_task_set(tasks) if send else "")


def test_a_heartbeat_stores_the_task_list_once_and_the_view_reads_who_runs_what(
        fake: fakeredis.FakeRedis) -> None:
    scripts = Scripts(fake, KEYS)
    beat(scripts, "a", "app_a", ["orders.expire", "orders.remind"])
    beat(scripts, "b", "app_b", ["mail.send"])
    beat(scripts, "a", "app_a", ["orders.expire", "orders.remind"], send=False)
    assert fake.hlen(KEYS.task_sets) == 2, "one entry per distinct task set"
    view = drive(fake, read_fleet(KEYS))
    assert [p.id for p in view.runners("mail.send")] == ["b"]
    assert view.runners("mail.send", exclude="b") == []
    assert view.runners("mail.send", group="other") == [], "b does not serve that group"
    assert not view.may_run("nobody.has")
    assert "b (package 'app_b', groups default)" in view.describe(exclude="a")
    beat(scripts, "c", "app_c", ["bulk.send"], groups=("bulk",))
    view = drive(fake, read_fleet(KEYS))
    assert view.may_run_anywhere("bulk.send") and view.may_run_anywhere("mail.send")
    assert not view.may_run_anywhere("nobody.has"), "timers move refuses to move it there"


def test_a_task_set_no_live_listener_names_is_dropped_when_its_listener_goes(
        fake: fakeredis.FakeRedis) -> None:
    scripts = Scripts(fake, KEYS)
    beat(scripts, "a1", "app_a", ["x.y"])
    beat(scripts, "a2", "app_a", ["x.y"])
    beat(scripts, "b", "app_b", ["z.w"])
    scripts.heartbeat("a1", 30_000, "")  # a1 stops: a2 still names the same set
    assert fake.hexists(KEYS.task_sets, task_set_digest(["x.y"]))
    scripts.heartbeat("a2", 30_000, "")
    assert not fake.hexists(KEYS.task_sets, task_set_digest(["x.y"]))
    assert fake.hexists(KEYS.task_sets, task_set_digest(["z.w"]))


def test_a_heartbeat_with_a_list_but_no_digest_writes_nothing(fake: fakeredis.FakeRedis) -> None:
    with pytest.raises(redis.ResponseError, match="timers heartbeat"):
        Scripts(fake, KEYS).heartbeat("a", 30_000, "{}", "", "x.y")
    assert fake.keys("*") == []


def test_a_listener_that_announced_nothing_is_unknown_not_a_runner() -> None:
    view = FleetView((Peer("old", "tasks", ("default",), None),))
    assert view.runners("any.task") == []
    assert view.may_run("any.task"), "it might run it: a retry is not skipped for it"
    assert FleetView().may_run("any.task"), "no live listener: one started later may"
    assert view.may_run_anywhere("any.task") and FleetView().may_run_anywhere("any.task")


def test_hand_backs_wait_longer_each_time_and_are_bounded() -> None:
    delays = [hand_over_delay_ms(n) for n in range(1, 40)]
    assert delays[0] == HAND_OVER_FIRST_MS
    assert delays == sorted(delays) and max(delays) == HAND_OVER_MAX_MS
    record = Record("mail.send", [1], {Option.ATTEMPTS: "2"})
    once = Record.decode(handed_back(record, 1234))
    twice = Record.decode(handed_back(once, 9999))
    assert handed_over(once) == 1 and handed_over(twice) == 2
    assert twice.options[Option.WAITED_FROM] == "1234", "lateness counts from its own due"
    assert twice.options[Option.ATTEMPTS] == "2", "attempts unchanged"


class FakePeers:
    """The peers part with a fixed view."""

    def __init__(self, view: FleetView) -> None:
        self.fleet = view

    async def runners(self, task: str, group: str) -> tuple[list[Peer], FleetView]:
        return self.fleet.runners(task, group, exclude="me"), self.fleet

    def refusal(self, view: FleetView) -> str:
        return view.describe(exclude="me")


def run_lacking(view: FleetView, options: dict[str, str] | None = None) -> Any:
    record = Record("mail.send", [1], options or {}).encode()

    async def scenario() -> Any:
        runner = Runner(2)
        try:
            executor = executor_of(runner, peers=FakePeers(view), name="listener me")
            return await executor.execute(Run("7", "t", record, round(REDIS_NOW_MS), 0,
                                              "sweep"))
        finally:
            runner.shutdown()

    return asyncio.run(scenario())


def test_a_timer_whose_task_another_live_listener_has_is_handed_back_uncounted() -> None:
    other = Peer("b", "app_b", ("default",), frozenset({"mail.send"}))
    done = run_lacking(FleetView((other,)))
    assert done.report is None, "not a run: nothing reported"
    assert done.ending.kind is EndingKind.WAIT
    assert done.ending.retry_delay_ms == round(REDIS_NOW_MS) + HAND_OVER_FIRST_MS
    handed = Record.decode(done.ending.retry_entry.partition(":")[2])
    assert handed_over(handed) == 1 and Option.ATTEMPTS not in handed.options
    again = run_lacking(FleetView((other,)), {Option.HANDED_OVER: "3"})
    assert again.ending.retry_delay_ms == round(REDIS_NOW_MS) + hand_over_delay_ms(4)


def test_a_timer_no_live_listener_can_run_is_refused_naming_those_seen() -> None:
    wrong_group = Peer("b", "app_b", ("reports",), frozenset({"mail.send"}))
    stray = Peer("c", "tasks", ("default",), frozenset({"hello.world"}))
    done = run_lacking(FleetView((wrong_group, stray)))
    failure = done.ending.failure
    assert done.ending.kind is EndingKind.FAIL and failure is not None
    assert failure.kind == "refused"
    assert "b (package 'app_b', groups reports)" in failure.message
    assert "c (package 'tasks', groups default)" in failure.message
    alone = run_lacking(FleetView()).ending.failure
    assert alone is not None and "no other live listener" in alone.message


def test_the_finish_script_puts_a_handed_back_timer_back_due_later_uncounted(
        fake: fakeredis.FakeRedis) -> None:
    with Timers(fake) as t:
        t.schedule("mail.send", [1], id="m1", in_=0)
    scripts = Scripts(fake, KEYS)
    reply = scripts.claim(limit=10, lease_ms=10_000, horizon_ms=0, listener_id="a")
    run = Run.parse(*reply[3:6])
    now_ms = int(reply[0]) // 1000
    record = run.record()
    scripts.finish(retention_ms=60_000, endings=[Ending.wait(
        run, handed_back(record, run.waited_from_ms), now_ms + 100).wire()])
    assert fake.zscore(KEYS.due, "m1") == now_ms + 100
    stored = Record.decode(fake.hget(KEYS.records, "m1").decode())
    assert handed_over(stored) == 1 and Option.ATTEMPTS not in stored.options
    counters = {k.decode(): int(v) for k, v in fake.hgetall(KEYS.stats).items()}
    assert not {"failed", "retried", "handed_back"} & set(counters)
    assert fake.zcard(KEYS.failures) == 0


def test_the_listener_s_peers_answer_from_a_view_read_once_a_second() -> None:
    sync = fakeredis.FakeRedis()
    beat(Scripts(sync, KEYS), "b", "app_b", ["x.y"])
    clock = [100.0]
    reads: list[None] = []

    async def read() -> list[Any]:
        reads.append(None)
        return [sync.execute_command(*call.command) for call in fleet_calls(KEYS)]

    peers = Peers("me", "app_a", lambda: ("a.b",), read, monotonic=lambda: clock[0])

    async def scenario() -> None:
        found, _ = await peers.runners("x.y", "default")
        assert [p.id for p in found] == ["b"]
        assert peers.run_elsewhere(b"timers:t1:x.y:[1]", b"timers:")
        assert not peers.run_elsewhere(b"timers:t1:nobody.has:[1]", b"timers:")
        assert not peers.run_elsewhere(b"timers:t1;x.y", b"timers:"), "malformed: rejected"
        await peers.runners("x.y", "default")
        assert len(reads) == 1, "a view younger than a second serves"
        clock[0] += 0.5
        none, view = await peers.runners("nobody.has", "default")
        assert none == [] and len(reads) == 2, "a refusal rests on a view read just now"
        assert "b (package 'app_b'" in peers.refusal(view)

    asyncio.run(scenario())


def test_a_listener_sends_its_task_list_once_and_again_when_it_is_gone() -> None:
    server = fakeredis.FakeServer()
    peers = Peers.over(fakeredis.FakeAsyncRedis(server=server), KEYS, "me", "app_a",
                       lambda: ("a.b", "c.d"))
    digest, listed = peers.announcement()
    assert (digest, listed) == (task_set_digest(["a.b", "c.d"]), "a.b\nc.d")
    peers.announced()
    assert peers.announcement() == (digest, "")
    sync = fakeredis.FakeRedis(server=server)
    scripts = Scripts(sync, KEYS)
    info = json.dumps({"task_set": digest})
    stored, *_ = scripts.heartbeat("me", 30_000, info, digest, listed)
    assert stored == 1
    stored, *_ = scripts.heartbeat("me", 30_000, info, digest, "")
    assert stored == 1 and not peers.resend
    sync.delete(KEYS.task_sets)  # a flush, a failover that lost it
    stored, *_ = scripts.heartbeat("me", 30_000, info, digest, "")
    assert stored == 0, "the heartbeat says the list is gone"
    peers.gone_from_server()
    assert peers.announcement() == (digest, listed)
    stored, *_ = scripts.heartbeat("me", 30_000, info, digest, listed)
    assert stored == 1 and sync.hexists(KEYS.task_sets, digest)


def test_an_expired_key_of_a_task_another_listener_runs_is_left_to_it() -> None:
    """A rejection is for good: it rests on a view read after the key came, never on one
    read before the listener that runs its task announced (two listeners starting
    together: the first rejected the other's keys for up to a second)."""
    sync = fakeredis.FakeRedis()
    clock = [100.0]

    async def read() -> list[Any]:
        return [sync.execute_command(*call.command) for call in fleet_calls(KEYS)]

    peers = Peers("me", "app_a", lambda: ("a.b",), read, monotonic=lambda: clock[0])
    theirs, nobodys = b"timers:t1:x.y:[1]", b"timers:t2:no.one:[1]"
    assert peers.screen(theirs, b"timers:") == "reject", "not serving yet: nothing known"
    asyncio.run(peers.view())
    beat(Scripts(sync, KEYS), "b", "app_b", ["x.y"])  # b announces after that read
    assert peers.screen(theirs, b"timers:") == "ask", "a young view may predate b"
    clock[0] += 0.1
    asyncio.run(peers.fresh_view())
    assert peers.screen(theirs, b"timers:") == "elsewhere"
    assert peers.screen(nobodys, b"timers:") == "ask"


class _Endings:
    """Where :class:`RejectedKeys` writes its rejections: kept in a list."""

    def __init__(self) -> None:
        self.added: list[Ending] = []

    def add(self, ending: Ending) -> None:
        self.added.append(ending)


class _Tracker:
    def redis_time_ms(self) -> int:
        return REDIS_NOW_MS


def test_an_expired_key_no_live_listener_runs_is_rejected_once_a_fresh_view_says_so() -> None:
    """With a view in hand (``ask``), a key of a task nobody runs is recorded as rejected
    once a view read after it came shows nobody runs it; one of a task another listener
    announced meanwhile is left to it, and nothing is recorded for it."""
    sync = fakeredis.FakeRedis()

    async def read() -> list[Any]:
        return [sync.execute_command(*call.command) for call in fleet_calls(KEYS)]

    clock = [100.0]
    peers = Peers("me", "app_a", lambda: ("a.b",), read, monotonic=lambda: clock[0])
    endings, counted = _Endings(), []
    rejecting = RejectedKeys(peers, KEYS, _Tracker(), endings,  # type: ignore[arg-type]
                             lambda: counted.append(1))
    theirs, nobodys = b"timers:t1:x.y:[1]", b"timers:t2:no.one:[1]"

    async def scenario() -> None:
        await peers.view()
        beat(Scripts(sync, KEYS), "b", "app_b", ["x.y"])  # b announces after that read
        clock[0] += 0.1
        for key, escaped in ((theirs, "t1"), (nobodys, "t2")):
            assert peers.screen(key, b"timers:") == "ask"
            rejecting.reject(Rejected(key, "no task", escaped))
        await asyncio.gather(*rejecting.rejecting)

    asyncio.run(scenario())
    assert [(e.kind, e.failure_id) for e in endings.added] == [(EndingKind.REJECT, "t2")]
    assert counted == [1]


def test_a_view_the_user_may_not_read_is_empty_and_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    async def denied() -> list[Any]:
        raise redis.exceptions.NoPermissionError("NOPERM this user has no permissions")

    peers = Peers("me", "app_a", lambda: ("a.b",), denied)

    async def scenario() -> None:
        for _ in range(3):
            found, view = await peers.runners("x.y", "default")
            assert found == [] and view.peers == ()

    asyncio.run(scenario())
    assert sum("cannot read the other listeners" in r.message for r in caplog.records) == 1
