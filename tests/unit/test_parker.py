"""Which due timers the listener's parker hands to park.lua: those a gate would weigh by
their concurrency key alone, with the key the gate would compute."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
import redis

import timers
from timers.listener.finding.claimer import Claimer
from timers.listener.flow.gate import START_WINDOW_S, Admission, FlowGate
from timers.listener.flow.parker import Parker
from timers.model.keys import Keyspace
from timers.model.policy import policy_of
from timers.model.runs import Run
from timers.store.script_rows import ParkTimer
from timers.store.scripts import Scripts


@timers.task(concurrency=1, key=lambda device, cmd: f"device:{device}")
def per_device(device: int, cmd: str) -> None: ...


@timers.task(concurrency=3)
def capped() -> None: ...


@timers.task(concurrency=1, key=lambda n: "k", rate="10/s")
def keyed_and_rated(n: int) -> None: ...


@timers.task(rate="10/s")
def rated_only(n: int) -> None: ...


@timers.task(concurrency=2, key=lambda n: "pair", rate="10/s")
def paired_and_rated(n: int) -> None: ...


@timers.task(concurrency=1, key=lambda n: "k", group="video")
def video(n: int) -> None: ...


@timers.task(concurrency=1, key=lambda: 1 / 0)
def broken() -> None: ...


def plain() -> None: ...


TASKS: dict[str, Any] = {"d.per_device": per_device, "d.capped": capped, "d.plain": plain,
                         "d.rated": keyed_and_rated, "d.paced": rated_only, "d.video": video,
                         "d.broken": broken, "d.paired": paired_and_rated}


def resolve(task: str) -> Any:
    return TASKS[task]  # KeyError: a task this listener cannot import


@pytest.fixture
def parker() -> Parker:
    flow = FlowGate(None, 30.0, on_held=lambda count: None, shards=1, shard=0)  # type: ignore[arg-type]
    return Parker(None, ("default",), 30.0, resolve, flow)  # type: ignore[arg-type]


@pytest.mark.parametrize(("record", "expected"), [
    ('d.per_device:[7,"on"]', ("device:7", 1)),
    ("d.capped:", ("task:d.capped", 3)),
    ("d.plain;k=room%3A1:", ("room:1", 1)),
])
def test_a_timer_limited_by_its_key_alone_is_parked_with_that_key(
        parker: Parker, record: str, expected: tuple[str, int]) -> None:
    assert parker._parkable("id1", "5", record) == ParkTimer("id1", record, *expected)


@pytest.mark.parametrize("record", [
    "d.plain:", "d.rated:[1]", "d.video:[1]", "d.broken:", "d.unknown:",
    'd.per_device;r=n;v=1:[7,"on"]', "not a record",
])
def test_everything_else_is_left_to_the_claims(parker: Parker, record: str) -> None:
    assert parker._parkable("id1", "5", record) is None


def test_parking_is_wanted_once_gates_hold_runs_and_rests_after_an_empty_pass() -> None:
    class NothingToPark:
        async def peek(self, limit: int, groups: Any) -> list[bytes]:
            return [b"id1", b"5", b"d.plain:"]

    flow = FlowGate(None, 30.0, on_held=lambda count: None, shards=1, shard=0)  # type: ignore[arg-type]
    parker = Parker(NothingToPark(), ("default",), 30.0, resolve, flow)  # type: ignore[arg-type]
    assert not parker.wanted()
    flow.held = 1
    assert parker.wanted()
    assert asyncio.run(parker.park_backlog()) == 0
    assert not parker.wanted()
    flow.held += 19
    assert not parker.wanted()
    flow.held += 1
    assert parker.wanted()


@pytest.mark.parametrize("error", [
    redis.exceptions.OutOfMemoryError("OOM command not allowed"),
    redis.exceptions.ConnectionError("Connection closed by server."),
    redis.exceptions.RedisClusterException("cluster topology changed"),
])
def test_parking_that_fails_leaves_the_backlog_to_the_claims(error: Exception) -> None:
    """A full server, a lost connection or a cluster change while parking must not end
    the claim loop: the claims decide those timers as before."""
    class Failing:
        calls = 0

        def wanted(self) -> bool:
            return True

        async def park_backlog(self) -> int:
            Failing.calls += 1
            raise error

    claimer = SimpleNamespace(parker=Failing(), tracker=SimpleNamespace(backlogged=True),
                              stopping=asyncio.Event())
    asyncio.run(Claimer._park_backlog(claimer))  # type: ignore[arg-type]
    assert Failing.calls == 1


# -- claimed runs screened before they start ----------------------------------------------


def screened(fake: fakeredis.FakeRedis, records: list[str], reruns: int = 0,
             fail: BaseException | None = None) -> tuple[list[str], list[str], FlowGate, int]:
    """Schedule ``records`` due now (ids t0, t1, …), claim them all and screen them:
    (ids started, ids waiting for a key, the gate, how many on_held heard of)."""
    with timers.Timers(fake) as producer:
        for i, record in enumerate(records):
            task, _, args = record.partition(":")
            producer.schedule(task, json.loads(args) if args else None, in_=-1, id=f"t{i}")
    told: list[int] = []

    async def scenario() -> tuple[list[str], FlowGate]:
        client = fakeredis.FakeAsyncRedis(server=fake.connection_pool.connection_kwargs[
            "server"])
        scripts = Scripts(client, Keyspace())
        flow = FlowGate(scripts, 30.0, on_held=lambda count: None, shards=1, shard=0)
        flow.on_held = told.append
        reply = await scripts.claim(limit=50, lease_ms=30_000, horizon_ms=0, listener_id="me")
        items = reply[3:]
        runs = [replace(Run.parse(*items[i:i + 3]), reruns=reruns)
                for i in range(0, len(items), 3)]
        if fail is not None:
            async def broken(*_: Any, **__: Any) -> Any:
                raise fail
            scripts.gate = broken  # type: ignore[method-assign]
        started = await flow.screen(runs, resolve)
        await client.aclose()
        return [run.timer_id for run in started], flow

    started, flow = asyncio.run(scenario())
    waiting = sorted(i.decode() for i in fake.zrange(f"{Keyspace().prefix}|waitk|device:7", 0, -1))
    return sorted(started), waiting, flow, sum(told)


def test_claimed_runs_a_full_key_holds_back_never_start_and_the_rest_skip_the_gate_later(
    fake: fakeredis.FakeRedis
) -> None:
    """1,000 commands for 50 devices: the 950 that must wait were made into tasks first,
    and kept both cores busy while the 50 that could run waited for the gate."""
    records = [f'd.per_device:[7,"c{i}"]' for i in range(5)] + ['d.per_device:[8,"x"]']
    started, waiting, flow, told = screened(fake, records)
    assert started == ["t0", "t5"]  # each device's first, in id order
    assert waiting == ["t1", "t2", "t3", "t4"] and told == 4 and flow.held == 4
    assert len(flow.holding) == 2  # their slots, held from the claim on


def test_runs_a_gate_would_not_weigh_by_key_alone_are_started_unscreened(
    fake: fakeredis.FakeRedis
) -> None:
    records = ['d.rated:[1]', 'd.video:[1]', 'd.broken:', 'd.plain:', 'd.unknown:']
    started, _, flow, told = screened(fake, records)
    assert started == ["t0", "t1", "t2", "t3", "t4"] and not flow.holding and told == 0


@pytest.mark.parametrize("fail", [
    None, redis.ConnectionError("gone"), redis.exceptions.OutOfMemoryError("OOM full"),
    redis.exceptions.BusyLoadingError("LOADING after a restart")])
def test_reruns_and_a_failed_gate_call_leave_every_run_to_ask_at_its_start(
    fake: fakeredis.FakeRedis, fail: BaseException | None
) -> None:
    """A rerun (its listener died) decides at its start; a gate call that a lost
    connection, a full server or a restarting one refuses decides nothing."""
    records = [f'd.per_device:[7,"c{i}"]' for i in range(3)]
    started, waiting, flow, _ = screened(fake, records, reruns=0 if fail else 1, fail=fail)
    assert started == ["t0", "t1", "t2"] and waiting == [] and not flow.holding


def test_a_run_the_screen_let_go_is_not_gated_again_at_its_start() -> None:
    """Gated twice, a run would find its key full with its own slot and wait behind it."""
    flow = FlowGate(None, 30.0, on_held=lambda count: None, shards=1, shard=0)  # type: ignore[arg-type]  # any gate call would fail
    run = Run("9", "t0", 'd.per_device:[7,"on"]', due_ms=1, reruns=0, source="sweep")
    flow.holding.add("9")  # as screen leaves a run it let go
    record = run.record()
    admission = asyncio.run(flow.admit(run, record, policy_of(per_device)))
    assert admission.held is None


SLOW = 0.05


def admit_first(fake: fakeredis.FakeRedis, task: str, gate_delay: float = 0.0
                ) -> tuple[float, float, Admission]:
    """Schedule a due timer of ``task``, claim it and ask the flow gate about its run, the
    gate call taking ``gate_delay`` s more; (monotonic before, after the ask, the word)."""
    with timers.Timers(fake) as producer:
        producer.schedule(task, [1], in_=-1, id="r0")

    async def scenario() -> tuple[float, float, Admission]:
        client = fakeredis.FakeAsyncRedis(server=fake.connection_pool.connection_kwargs[
            "server"])
        scripts = Scripts(client, Keyspace())
        flow = FlowGate(scripts, 30.0, on_held=lambda count: None, shards=1, shard=0)
        reply = await scripts.claim(limit=5, lease_ms=30_000, horizon_ms=0, listener_id="me")
        run = Run.parse(*reply[3:6])
        gate = scripts.gate

        async def slow_gate(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(gate_delay)  # a round trip on a loaded machine
            return await gate(*args, **kwargs)

        scripts.gate = slow_gate  # type: ignore[method-assign]
        before = time.monotonic()
        admission = await flow.admit(run, run.record(), policy_of(TASKS[task]))
        after = time.monotonic()
        await client.aclose()
        return before, after, admission

    return asyncio.run(scenario())


@pytest.mark.parametrize("task", ["d.paced", "d.rated"])
def test_a_run_a_rate_lets_go_must_start_within_the_window_of_its_gate_call(
        fake: fakeredis.FakeRedis, task: str) -> None:
    """The gate lets a rate's runs go an interval apart on the Redis clock; the listener's
    dispatch after the go can take longer for one run than for the next (a thread busy, a
    loaded event loop): so a run the gate let go carries the latest time it may call its
    function, counted from when the gate call was sent (the gate decided after that). So
    does a run of a key whose limit is 1: handed back, it keeps the key's one slot."""
    before, after, admission = admit_first(fake, task, SLOW)
    assert admission.held is None
    assert admission.start_by is not None
    assert after - before >= SLOW
    # from when the call was sent (the gate may have decided right then), not its reply
    assert before + START_WINDOW_S <= admission.start_by < before + START_WINDOW_S + SLOW / 2


def test_a_run_holding_one_of_several_slots_of_its_key_has_no_start_window(
        fake: fakeredis.FakeRedis) -> None:
    """Handed back late, a run of a key with a limit of 2 would start after a later run of
    its key that took the other slot meanwhile (FIFO per key): it starts however late."""
    _, _, admission = admit_first(fake, "d.paired")
    assert admission.held is None
    assert admission.start_by is None
