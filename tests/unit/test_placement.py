"""Placement on a sharded prefix (rule 3 of timers/ops/shards.py): a claimed run whose
task declares a limit living in another shard moves there once, in four steps
(``arrive.lua`` a, ``depart.lua`` d, ``arrive.lua`` c, ``depart.lua`` k), and a crash or a
stall between any two of them leaves the timer runnable exactly once (the transitions T24
to T26 of docs/state-machine.md). Two shards' keyspaces on one fakeredis."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

import timers
from timers.listener.finding.claimer import FLOOR_RETRY_S, Claimer, ClaimerHooks
from timers.listener.finding.due_tracker import DueTracker
from timers.listener.flow.gate import FlowGate
from timers.listener.flow.parker import Parker
from timers.listener.flow.placer import Placer
from timers.listener.retrying import Outage
from timers.model.clock import SystemClock
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.model.policy import policy_of
from timers.model.runs import Run
from timers.ops.shards import ShardLayout, shard_of_key
from timers.store.script_rows import Arrival, Departure, GateRun, NewTimer, Settle
from timers.store.scripts import Scripts

SHARDS = ShardLayout(Keyspace("{timers}"), 2, "timers").keyspaces
THREE = ShardLayout(Keyspace("{timers}"), 3, "timers").keyspaces
LEASE_MS = 15_000
TASK = "tests.unit.test_placement.device_command"


@timers.task(concurrency=1, key=lambda device: f"dev:{device}")
def device_command(device: int) -> None:
    """One command at a time per device."""


@timers.task(rate="600/m")
def paced() -> None:
    """Ten starts a second."""


RATED_TASK = "tests.unit.test_placement.rated_command"


@timers.task(concurrency=1, key=lambda device: f"rdev:{device}", rate="4/s")
def rated_command(device: int) -> None:
    """One command at a time per device, four starts a second in all."""


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


# -- the listener's part (timers/listener/flow/placer.py) ------------------------------------


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


# -- order across shards: the floor (docs/state-machine.md, Cluster, rule 5) --------------


def _now_ms(fake: fakeredis.FakeRedis) -> int:
    seconds, micros = fake.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _floor(s: Scripts) -> int:
    return int(s.floor(["default"], [TASK]))


def _claim_keyed(s: Scripts, floor: int | None) -> list[Run]:
    reply = s.claim(limit=10, lease_ms=LEASE_MS, horizon_ms=0, listener_id="h:1:x",
                    keyed_tasks=[TASK], floor=floor)
    return [Run.parse(*reply[i:i + 3]) for i in range(3, len(reply), 3)]


def _ids(runs: list[Run]) -> list[str]:
    return [run.escaped_id for run in runs]


def test_a_keyed_timer_enters_its_keys_order_only_after_earlier_ones_of_its_task_elsewhere(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    """A device's command due first sits in shard 0 (its id's), the next one in shard 1
    (its device's): shard 1 claims the later one only once the earlier one has entered
    the device's order there, all through its move (claimed in shard 0, arriving, pending
    in shard 1 after it settled): then both are claimed, in order. Commands of other
    tasks, and of a key given at schedule time, never wait for the floor."""
    source, target = shards
    device, now = _device_in(1), _now_ms(fake)
    source.schedule([NewTimer("first", f"{TASK}:[{device}]", "at", now - 2000, "n")])
    target.schedule([NewTimer("second", f"{TASK}:[{device}]", "at", now - 1000, "n"),
                     NewTimer("plain", "tasks.other:[]", "at", now - 1000, "n"),
                     NewTimer("given", f"{TASK};k=dev%3A1:[1]", "at", now - 1000, "n")])
    assert _floor(source) == now - 2000
    assert _ids(_claim_keyed(target, _floor(source))) == ["given", "plain"]
    (claimed,) = _claim_keyed(source, _floor(target))  # the earliest: not held
    assert claimed.escaped_id == "first"
    assert _floor(source) == now - 2000  # claimed, not gated yet: it still holds
    assert _claim_keyed(target, _floor(source)) == []
    assert _arrive(target, claimed) == [1]
    assert _depart(source, claimed) == 1
    assert _floor(source) > now  # nothing of the task left in shard 0
    assert _claim_keyed(target, _floor(source)) == []  # arriving: it holds the later one
    assert _settle(target, claimed, "c") == 1
    assert _ids(_claim_keyed(target, _floor(source))) == ["first", "second"]


def test_the_earliest_timer_moving_in_holds_the_floor_whatever_moves_in_after_it(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    """Two commands of a device move into its shard, the first due before the command
    waiting there, the other after it: until they settle the earliest one holds the
    floor, so the waiting command is not claimed ahead of it (a later arrival does not
    raise the floor past it)."""
    source, target = shards
    device, now = _device_in(1), _now_ms(fake)
    source.schedule([NewTimer("early", f"{TASK}:[{device}]", "at", now - 3000, "n"),
                     NewTimer("late", f"{TASK}:[{device}]", "at", now - 500, "n")])
    target.schedule([NewTimer("waiting", f"{TASK}:[{device}]", "at", now - 1000, "n")])
    early, late = sorted(_claim_keyed(source, None), key=lambda r: r.due_ms)
    assert (early.escaped_id, late.escaped_id) == ("early", "late")
    assert _arrive(target, early) == [1] and _arrive(target, late) == [1]
    for run in (early, late):
        assert _depart(source, run) == 1
    assert _claim_keyed(target, _floor(source)) == []  # both arriving: nothing passes them
    assert _settle(target, early, "c") == 1 and _settle(target, late, "c") == 1
    assert _ids(_claim_keyed(target, _floor(source))) == ["early", "waiting", "late"]


def test_a_stale_entry_of_the_order_barrier_does_not_hold_the_floor(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    source, _ = shards
    now = _now_ms(fake)
    source.schedule([NewTimer("a", f"{TASK}:[{_device_in(1)}]", "at", now - 500, "n")])
    assert _ids(_claim_keyed(source, None)) == ["a"]
    token = fake.hkeys(SHARDS[0].running_records)[0]
    fake.hdel(SHARDS[0].running_records, token)  # its run is gone (ended, handed on)
    fake.zrem(SHARDS[0].running, token)
    assert _floor(source) > now


def test_a_timer_waiting_for_its_rate_does_not_hold_the_floor(
        fake: fakeredis.FakeRedis, shards: tuple[Scripts, Scripts]) -> None:
    """A keyed task's timer held for its rate has entered its key's order (its note in the
    order barrier, ``r|``): it does not hold the other shards' keyed timers back. It did:
    the floor read its note's due time, earlier than the rate's next slot, where its
    timer, the rate's pacer, is pending. So the other shards' timers due in between
    waited for it, and it waited for them (its claim held by their floor): every claim
    of the prefix stopped (the chaos checker on Cluster, a task with a key and a rate)."""
    source, target = shards
    device, now = _device_in(1), _now_ms(fake)
    source.schedule([NewTimer("r1", f"{RATED_TASK}:[{device}]", "at", now - 3000, "n"),
                     NewTimer("r2", f"{RATED_TASK}:[{device + 1}]", "at", now - 2900, "n")])
    target.schedule([NewTimer("later", f"{TASK}:[{device}]", "at", now - 2000, "n")])
    tasks = [RATED_TASK, TASK]
    runs = source.claim(limit=10, lease_ms=LEASE_MS, horizon_ms=0, listener_id="h:1:x",
                        keyed_tasks=tasks, floor=None)
    claimed = [Run.parse(*runs[i:i + 3]) for i in range(3, len(runs), 3)]
    assert _ids(claimed) == ["r1", "r2"]
    rate = ("task:" + RATED_TASK, 250, 1)
    assert [as_text(status) for status in source.gate(LEASE_MS, [
        GateRun(run.token, f"rdev:{device + n}", 1, *rate) for n, run in enumerate(claimed)
    ])] == ["go", "wait"]
    # r2 waits for the rate (its pacer, pending at the rate's next slot, 250 ms on)
    assert int(source.floor(["default"], tasks)) > now
    reply = target.claim(limit=10, lease_ms=LEASE_MS, horizon_ms=0, listener_id="h:1:x",
                         keyed_tasks=tasks, floor=int(source.floor(["default"], tasks)))
    assert [Run.parse(*reply[i:i + 3]).escaped_id for i in range(3, len(reply), 3)] == [
        "later"]
    # and the rate's pacer waits for no floor: it entered its order when it was queued
    reply = source.claim(limit=10, lease_ms=LEASE_MS, horizon_ms=1000, listener_id="h:1:x",
                         keyed_tasks=tasks, floor=now - 2500)
    assert [Run.parse(*reply[i:i + 3]).escaped_id for i in range(3, len(reply), 3)] == [
        "r2"]


def _lane_for(record: str, until: Callable[[list[int], list[Run]], bool]
              ) -> tuple[int, list[Run], float]:
    """A lane of shard 1 claiming, until ``until(floors asked, runs started)`` (5 s at
    most), with a timer of ``record`` due there and an earlier one of its task, if keyed,
    waiting in the other shard: (how many times it asked for the floor, the runs it
    started, the seconds it took)."""
    async def scenario() -> tuple[int, list[Run], float]:
        fake = fakeredis.FakeAsyncRedis()
        scripts = Scripts(fake, SHARDS[1])
        seconds, micros = await fake.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        await scripts.schedule([NewTimer("later", record, "at", now - 100, "n")])
        floors: list[int] = []
        started: list[Run] = []
        done = asyncio.Event()

        async def floor(groups: Any, tasks: Any) -> int:
            floors.append(now - 1000)  # an earlier one waits in the other shard
            if until(floors, started):
                done.set()
            return floors[-1]

        def start(run: Run) -> None:
            started.append(run)
            if until(floors, started):
                done.set()

        stopping = asyncio.Event()
        clock = SystemClock()
        tracker = DueTracker(clock)
        hooks = ClaimerHooks(free_slots=lambda: 5, take_event_ids=lambda n: [],
                             busy=lambda: False, start=start,
                             give_up=lambda exc: None, keyed_tasks=lambda: (TASK,),
                             floor=floor)
        flow = FlowGate(scripts, LEASE_MS / 1000, on_held=lambda n: None, shards=2, shard=1)
        claimer = Claimer(scripts, ("default",), "h:1:x", LEASE_MS / 1000, clock, tracker,
                          hooks, stopping, poke=asyncio.Event(),
                          parker=Parker(scripts, ("default",), LEASE_MS / 1000, _resolve,
                                        flow),
                          ahead_share=5, outage=Outage())
        began = time.monotonic()
        loop = asyncio.create_task(claimer.run(burst=False))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 5)
        took = time.monotonic() - began
        stopping.set()
        claimer.poke.set()
        await asyncio.wait_for(loop, 5)
        await fake.aclose()
        return len(floors), started, took

    return asyncio.run(scenario())


def test_a_lane_whose_due_timers_wait_for_the_floor_claims_again_soon_not_at_once() -> None:
    """A claim that leaves due timers below the other shards' floor (they wait for an
    earlier one of their task there) is sent again after FLOOR_RETRY_S, or when something
    wakes the lane; not in a loop of round trips while the floor does not move."""
    asked, started, took = _lane_for(f"{TASK}:[{_device_in(1)}]",
                                     lambda floors, _: len(floors) >= 6)
    assert started == []
    assert asked >= 6 and took >= 4 * FLOOR_RETRY_S, (asked, took)


def test_a_lane_that_meets_no_keyed_timer_does_not_ask_for_the_floor() -> None:
    asked, started, _ = _lane_for("tasks.plain:[]", lambda _, started: bool(started))
    assert [run.escaped_id for run in started] == ["later"]
    assert asked == 0


def test_the_floor_is_the_least_of_the_other_shards_and_nothing_passes_a_shard_unheard(
        ) -> None:
    async def scenario() -> tuple[int, int, int]:
        fake = fakeredis.FakeAsyncRedis()
        scripts = [Scripts(fake, keys) for keys in THREE]
        seconds, micros = await fake.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        await scripts[1].schedule([NewTimer("b", f"{TASK}:[1]", "at", now - 300, "n")])
        await scripts[2].schedule([NewTimer("c", f"{TASK}:[2]", "at", now - 700, "n")])
        await scripts[0].schedule([NewTimer("a", f"{TASK}:[0]", "at", now - 900, "n")])
        placer = Placer(scripts.__getitem__, 0, 3, LEASE_MS / 1000, _resolve,
                        hand_back=lambda r: None, redis_now_ms=lambda: now)
        least = await placer.floor(["default"], [TASK])  # its own shard's "a" aside

        async def unheard(*_: Any) -> Any:
            raise ConnectionError("failing over")

        scripts[2].floor = unheard  # type: ignore[method-assign]
        cut_off = await placer.floor(["default"], [TASK])
        await fake.aclose()
        return now, least, cut_off

    now, least, cut_off = asyncio.run(scenario())
    assert least == now - 700
    assert cut_off == 0


def test_on_several_shards_the_parker_leaves_a_key_the_task_works_out_to_the_claims() -> None:
    """Parked, a command native to its device's shard would wait in the device's queue
    ahead of earlier ones still pending in other shards; a key given at schedule time
    lives in its key's shard from the start and is parked as on one server."""
    flow = FlowGate(None, 30.0, on_held=lambda n: None, shards=2, shard=1)  # type: ignore[arg-type]
    parker = Parker(None, ("default",), 30.0, _resolve, flow,  # type: ignore[arg-type]
                    moves=Placer.not_parked)
    native = f"{TASK}:[{_device_in(1)}]"
    assert parker._parkable("a", "5", native) is None
    given = f"{TASK};k=dev%3A{_device_in(1)}:[{_device_in(1)}]"
    assert parker._parkable("b", "5", given) is not None


@pytest.mark.parametrize("task", [TASK, "tests.unit.test_placement.paced"])
def test_a_timer_a_producer_placed_by_its_tasks_declaration_is_home_for_the_listener(
        task: str) -> None:
    """Producer and listener work out a timer's limit the same way
    (:meth:`TaskPolicy.limit_name`, ``plan_of``): born there, it never moves."""
    for device in range(20):
        name = policy_of(_resolve(task)).limit_name(task, [device])
        assert name is not None
        home = shard_of_key(name, 2)
        placers = [Placer(lambda i: None, i, 2, 15.0, _resolve,  # type: ignore[arg-type,return-value]
                          hand_back=lambda r: None, redis_now_ms=lambda: 0.0) for i in range(2)]
        record = f"{task}:[{device}]" if task == TASK else f"{task}:[]"
        assert placers[home].home_of(Run("t", "id", record, 0, 0, "e")) is None
        assert placers[1 - home].home_of(Run("t", "id", record, 0, 0, "e")) == home
