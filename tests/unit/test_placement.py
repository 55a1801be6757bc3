"""Placement on a sharded prefix (rule 3 of timers/ops/shards.py): a claimed run whose
task declares a limit living in another shard moves there once, in four steps
(``arrive.lua`` a, ``depart.lua`` d, ``arrive.lua`` c, ``depart.lua`` k), and a crash or a
stall between any two of them leaves the timer runnable exactly once (the transitions T24
to T26 of docs/state-machine.md). Two shards' keyspaces on one fakeredis."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest

import timers
from timers.listener.placer import Placer
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.model.runs import Run
from timers.ops.shards import ShardLayout, shard_of_key
from timers.store.scripts import Arrival, Departure, NewTimer, Scripts, Settle

SHARDS = ShardLayout(Keyspace("{timers}"), 2, "timers").keyspaces
LEASE_MS = 15_000
TASK = "tests.unit.test_placement.device_command"


@timers.task(concurrency=1, key=lambda device: f"dev:{device}")
def device_command(device: int) -> None:
    """One command at a time per device."""


@timers.task(rate="600/m")
def paced() -> None:
    """Ten starts a second."""


def _device_in(shard: int) -> int:
    return next(d for d in range(100) if shard_of_key(f"dev:{d}", 2) == shard)


def _resolve(task: str) -> Any:
    return {TASK: device_command, "tests.unit.test_placement.paced": paced}[task]


def _schedule(s: Scripts, timer_id: str, record: str, how: str = "n") -> None:
    s.schedule([NewTimer(timer_id, record, "in", 0, how)])


def _claim(s: Scripts) -> list[Run]:
    reply = s.claim(limit=10, lease_ms=LEASE_MS, horizon_ms=0, listener_id="h:1:x")
    items = reply[3:]
    return [Run.parse(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]


def _lapse(fake: fakeredis.FakeRedis, keys: Keyspace, token: str) -> None:
    fake.zadd(keys.running, {token: 0}, xx=True)


@pytest.fixture
def shards(fake: fakeredis.FakeRedis) -> tuple[Scripts, Scripts]:
    return Scripts(fake, SHARDS[0]), Scripts(fake, SHARDS[1])


def _copy_of(run: Run) -> str:
    return run.record_text.replace(":", ";sh=0:", 1)


def _arrive(target: Scripts, run: Run) -> list[int]:
    return [int(x) for x in target.arrive(LEASE_MS, [Arrival(
        f"0|{run.token}", run.due_ms, run.escaped_id, _copy_of(run))])]


def _depart(source: Scripts, run: Run) -> int:
    return int(source.depart([Departure(run.token, "default", 1)])[0])


def _settle(target: Scripts, run: Run, verdict: str) -> int:
    return int(target.settle(LEASE_MS, [Settle(f"0|{run.token}", verdict, run.escaped_id,
                                              _copy_of(run))])[0])


def _pending(fake: fakeredis.FakeRedis, keys: Keyspace) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in fake.hgetall(keys.records).items()}


def test_a_move_in_four_steps_leaves_one_timer_in_the_target(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    source, target = shards
    _schedule(source, "t1", f"{TASK}:[{_device_in(1)}]")
    (run,) = _claim(source)
    assert _arrive(target, run) == [1]
    assert _arrive(target, run) == [0]  # written once
    assert _claim(target) == []  # inert until settled
    assert _depart(source, run) == 1
    assert _settle(target, run, "c") == 1
    assert int(source.departed([run.token], forget=True)) == 1
    (moved,) = _claim(target)
    assert (moved.escaped_id, moved.record_text) == ("t1", _copy_of(run))
    assert _claim(source) == []
    for keys in SHARDS:  # nothing else is left of the move
        for key in (keys.moves, keys.arrivals, keys.arrival_records):
            assert not fake.exists(key)
    assert fake.hget(SHARDS[0].stats, "placed") == b"1"
    assert not fake.hexists(SHARDS[0].running_records, run.token)


def test_a_crash_between_arrive_and_depart_drops_the_copy_and_the_rerun_moves(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    source, target = shards
    _schedule(source, "t1", f"{TASK}:[{_device_in(1)}]")
    (run,) = _claim(source)
    _arrive(target, run)
    assert [int(x) for x in source.departed([run.token])] == [2]  # held: wait
    assert _settle(target, run, "x") == 1
    _lapse(fake, SHARDS[0], run.token)  # its listener died: a claim reruns it
    (rerun,) = _claim(source)
    assert rerun.reruns == 1
    assert [int(x) for x in source.departed([run.token])] == [0]  # final: never leaves
    assert _settle(target, run, "d") == 1
    assert _depart(source, run) == 0  # the stalled listener comes back: too late
    assert _arrive(target, rerun) == [1]
    assert _depart(source, rerun) == 1
    assert _settle(target, rerun, "c") == 1
    assert list(_pending(fake, SHARDS[1])) == ["t1"]
    assert _pending(fake, SHARDS[0]) == {}


def test_a_crash_between_depart_and_settle_is_settled_once_from_the_sources_note(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    source, target = shards
    _schedule(source, "t1", f"{TASK}:[{_device_in(1)}]")
    (run,) = _claim(source)
    _arrive(target, run)
    assert _depart(source, run) == 1
    _lapse(fake, SHARDS[0], run.token)
    assert _claim(source) == []  # nothing of it left to rerun in the source
    assert [int(x) for x in source.departed([run.token])] == [1]  # it left: pend it
    assert _settle(target, run, "c") == 1
    assert _settle(target, run, "c") == 0  # the slow mover's own settle: nothing twice
    (moved,) = _claim(target)
    assert moved.escaped_id == "t1"
    assert _claim(target) == []


def test_a_rerun_holding_its_cut_runs_slot_does_not_leave(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    source, _ = shards
    _schedule(source, "t1", f"{TASK}:[{_device_in(1)}]")
    (run,) = _claim(source)
    fake.hset(SHARDS[0].held, run.token, "1|15000|dev:1")
    assert _depart(source, run) == 2
    assert fake.hexists(SHARDS[0].running_records, run.token)


def test_a_settled_arrival_replaces_an_older_timer_pending_under_its_id(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    source, target = shards
    device = _device_in(1)
    _schedule(target, "t1", f"{TASK};sh=0:[{device}]")
    _schedule(source, "t1", f"{TASK}:[{device}, 2]")
    (run,) = _claim(source)
    _arrive(target, run)
    _depart(source, run)
    _settle(target, run, "c")
    assert _pending(fake, SHARDS[1]) == {"t1": _copy_of(run)}


def test_bad_arguments_write_nothing(fake: fakeredis.FakeRedis,
                                     shards: tuple[Scripts, Scripts]) -> None:
    source, target = shards
    with pytest.raises(Exception, match="bad arrival"):
        target.arrive(LEASE_MS, [Arrival("0|1", 5, "t1", "x:1"), Arrival("nope", 5, "t2", "x:1")])
    with pytest.raises(Exception, match="bad token"):
        source.depart([Departure("1", "default", 1), Departure("x", "default", 1)])
    assert fake.keys("*") == []


# -- the listener's part (timers/listener/placer.py) ------------------------------------


async def _placers(fake: fakeredis.FakeAsyncRedis, handed: list[Run],
                   now_ms: list[float]) -> tuple[Placer, Placer]:
    scripts = [Scripts(fake, keys) for keys in SHARDS]
    return tuple(  # type: ignore[return-value]
        Placer(scripts.__getitem__, i, 2, LEASE_MS / 1000, _resolve,
               hand_back=handed.append, redis_now_ms=lambda: now_ms[0]) for i in range(2))


async def _claim_async(fake: fakeredis.FakeAsyncRedis, keys: Keyspace) -> list[Run]:
    reply = await Scripts(fake, keys).claim(limit=10, lease_ms=LEASE_MS, horizon_ms=0,
                                            listener_id="h:1:x")
    items = reply[3:]
    return [Run.parse(items[i], items[i + 1], items[i + 2]) for i in range(0, len(items), 3)]


def test_the_placer_moves_only_what_belongs_elsewhere_once() -> None:
    async def scenario() -> None:
        fake = fakeredis.FakeAsyncRedis()
        handed: list[Run] = []
        zero, one = await _placers(fake, handed, [0.0])
        here, there = _device_in(0), _device_in(1)
        await Scripts(fake, SHARDS[0]).schedule([
            NewTimer("a", f"{TASK}:[{there}]", "in", 0, "n"),
            NewTimer("b", f"{TASK}:[{here}]", "in", 0, "n"),
            NewTimer("c", f"{TASK};k=dev%3A{there}:[{there}]", "in", 0, "n"),
            NewTimer("d", "tests.unit.test_placement.paced:[]", "in", 0, "n")])
        runs = await _claim_async(fake, SHARDS[0])
        stay = await zero.place(runs)
        paced_home = shard_of_key("task:tests.unit.test_placement.paced", 2)
        assert sorted(r.escaped_id for r in stay) == ["b", "c"] + (["d"] if paced_home == 0
                                                                    else [])
        moved = await _claim_async(fake, SHARDS[1])
        assert sorted(r.escaped_id for r in moved) == ["a"] + (["d"] if paced_home else [])
        assert await one.place(moved) == moved  # moved once: never again
        assert zero.moved == len(moved) and handed == []
        assert not await fake.exists(SHARDS[0].moves, SHARDS[1].arrivals)
    asyncio.run(scenario())


def test_an_arrival_its_mover_left_is_settled_by_another_listener() -> None:
    async def scenario() -> None:
        fake = fakeredis.FakeAsyncRedis()
        now = [0.0]
        zero, one = await _placers(fake, [], now)
        await Scripts(fake, SHARDS[0]).schedule([
            NewTimer("a", f"{TASK}:[{_device_in(1)}]", "in", 0, "n")])
        (run,) = await _claim_async(fake, SHARDS[0])
        calls = Scripts(fake, SHARDS[1])

        async def settle_lost(*_: Any) -> Any:
            raise ConnectionError("the mover died here")

        real = calls.settle
        calls.settle = settle_lost  # type: ignore[method-assign]
        placer = Placer([Scripts(fake, SHARDS[0]), calls].__getitem__, 0, 2, LEASE_MS / 1000,
                        _resolve, hand_back=lambda r: None, redis_now_ms=lambda: now[0])
        assert await placer.place([run]) == []
        calls.settle = real  # type: ignore[method-assign]
        assert await _claim_async(fake, SHARDS[1]) == []  # inert: its source committed
        seconds, micros = await fake.time()
        now[0] = seconds * 1000 + micros / 1000 + LEASE_MS + 1
        assert await one.settle_lapsed() == 1
        assert [r.escaped_id for r in await _claim_async(fake, SHARDS[1])] == ["a"]
        assert await one.settle_lapsed() == 0
        assert not await fake.exists(SHARDS[0].moves)
        assert zero.moved == 0
    asyncio.run(scenario())


def test_a_listener_killed_between_arrive_and_depart_leaves_one_timer_that_runs_once() -> None:
    """The mover dies after writing the copy: its claim lapses in the source, another
    listener reruns it there and moves it, the dead one's arrival is dropped: one timer in
    the target, claimed once."""
    async def scenario() -> None:
        fake = fakeredis.FakeAsyncRedis()
        now = [0.0]
        await Scripts(fake, SHARDS[0]).schedule([
            NewTimer("a", f"{TASK}:[{_device_in(1)}]", "in", 0, "n")])
        (run,) = await _claim_async(fake, SHARDS[0])
        source = Scripts(fake, SHARDS[0])

        async def killed(*_: Any) -> Any:
            raise ConnectionError("the listener died here")

        source.depart = killed  # type: ignore[method-assign]
        dying = Placer([source, Scripts(fake, SHARDS[1])].__getitem__, 0, 2, LEASE_MS / 1000,
                       _resolve, hand_back=lambda r: None, redis_now_ms=lambda: now[0])
        assert await dying.place([run]) == []
        await fake.zadd(SHARDS[0].running, {run.token: 0}, xx=True)  # its lease lapses
        zero, one = await _placers(fake, [], now)
        (rerun,) = await _claim_async(fake, SHARDS[0])
        assert (rerun.escaped_id, rerun.reruns) == ("a", 1)
        assert await zero.place([rerun]) == []
        seconds, micros = await fake.time()
        now[0] = seconds * 1000 + micros / 1000 + LEASE_MS + 1
        assert await one.settle_lapsed() == 1  # the dead listener's arrival: dropped
        (moved,) = await _claim_async(fake, SHARDS[1])
        assert moved.escaped_id == "a" and ";rc=1" in moved.record_text  # a counted rerun
        assert await _claim_async(fake, SHARDS[1]) == []
        assert await _claim_async(fake, SHARDS[0]) == []
        for keys in SHARDS:
            assert not await fake.exists(keys.arrivals, keys.arrival_records, keys.moves)
    asyncio.run(scenario())
