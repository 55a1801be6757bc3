"""A run's flow plan is worked out once and kept on the run: a task's key function is
called once per run, however many stages weigh its limits (the claim's screen, the placer,
the gate at its start), so a key function that is not pure (it reads the time, a counter)
cannot give one run two keys."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import fakeredis
import pytest

import timers
from timers.exceptions import FlowKeyError
from timers.listener.flow.gate import FlowGate
from timers.listener.flow.placer import Placer
from timers.listener.flow.plan import plan_of_run
from timers.listener.leases import HeldRuns, LeaseKeeper
from timers.model.keys import Keyspace
from timers.model.policy import policy_of
from timers.model.runs import Run
from timers.store.script_rows import GateRun
from timers.store.scripts import Scripts

CALLS: list[str] = []
_COUNT = itertools.count()


def _impure(n: int) -> str:
    """Another key at each call, as a key function that reads the clock would give."""
    key = f"k{next(_COUNT)}"
    CALLS.append(key)
    return key


@timers.task(concurrency=1, key=_impure)
def keyed(n: int) -> None: ...


@timers.task(concurrency=1, key=_impure, rate="10/s")
def keyed_and_rated(n: int) -> None: ...


def _broken(n: int) -> str:
    CALLS.append("broken")
    raise ValueError("no key")


@timers.task(concurrency=1, key=_broken)
def failing(n: int) -> None: ...


TASKS: dict[str, Any] = {"p.keyed": keyed, "p.rated": keyed_and_rated}


def resolve(task: str) -> Any:
    return TASKS[task]


def _watched_gate(fake: fakeredis.FakeRedis,
                  asked: list[GateRun]) -> tuple[fakeredis.FakeAsyncRedis, Scripts]:
    """An asyncio client on ``fake``'s server, and its scripts, whose gate calls note the
    runs they ask about in ``asked``."""
    client = fakeredis.FakeAsyncRedis(server=fake.connection_pool.connection_kwargs["server"])
    scripts = Scripts(client, Keyspace())
    gate = scripts.gate

    async def seen(lease_ms: int, runs: list[GateRun]) -> Any:
        asked.extend(runs)
        return await gate(lease_ms, runs)

    scripts.gate = seen  # type: ignore[method-assign]
    return client, scripts


@pytest.mark.parametrize(("task", "shards"), [
    ("p.rated", 1),  # the screen reads its plan, the gate asks at its start
    ("p.keyed", 2),  # the screen lets it go; on shards, its gate weighs where its key lives
])
def test_a_key_function_is_called_once_per_run_through_the_screen_and_the_gate(
    fake: fakeredis.FakeRedis, task: str, shards: int
) -> None:
    CALLS.clear()
    with timers.Timers(fake) as producer:
        producer.schedule(task, [1], in_=-1, id="t0")
    asked: list[GateRun] = []

    async def scenario() -> None:
        client, scripts = _watched_gate(fake, asked)
        flow = FlowGate(scripts, 30.0, on_held=lambda count: None, shards=shards, shard=0)
        reply = await scripts.claim(limit=5, lease_ms=30_000, horizon_ms=0, listener_id="me")
        [run] = await flow.screen([Run.parse(*reply[3:6])], resolve)
        admission = await flow.admit(run, run.record(), policy_of(TASKS[task]))
        assert admission.held is None
        await client.aclose()

    asyncio.run(scenario())
    assert len(CALLS) == 1
    assert asked and {gated.key for gated in asked} == {CALLS[0]}


def test_the_placer_and_the_gate_read_one_plan_and_a_failing_key_is_reported_once() -> None:
    CALLS.clear()
    placer = Placer(lambda i: None, 0, 2, 15.0, resolve,  # type: ignore[arg-type,return-value]
                    hand_back=lambda r: None, redis_now_ms=lambda: 0.0)
    run = Run("1", "t0", "p.keyed:[1]", 0, 0, "sweep")
    placer.home_of(run)
    plan = plan_of_run(run, run.record(), policy_of(keyed))
    assert plan is not None and [plan.key] == CALLS

    run = Run("2", "t1", "p.failing:[1]", 0, 0, "sweep")
    CALLS.clear()
    for _ in range(2):
        with pytest.raises(FlowKeyError, match="no key"):
            plan_of_run(run, run.record(), policy_of(failing))
    assert CALLS == ["broken"]


def _device(n: int) -> str:
    return "device"


@timers.task(concurrency=1, key=_device, rate="1/s")
def paced(n: int) -> None: ...


@timers.task(concurrency=1, key=_device)
def one_at_a_time(n: int) -> None: ...


@pytest.mark.parametrize(("task", "asks"), [
    ("p.paced", 2),  # its rate again: the slot it left unused moves to now (T29)
    ("p.one", 1),  # its key's slot is its own already: nothing to ask
])
def test_a_run_admitted_again_asks_its_rate_again_not_its_key(
    fake: fakeredis.FakeRedis, task: str, asks: int
) -> None:
    """A rerun whose quarantine child found its lease stale goes to a new child, which is
    admitted again: the rate slot its first admission took went unused, so it asks its
    rate again, which lets it go on that slot moved to now while no other start was let go
    (T29: two starts never come closer than the interval on slots taken earlier); the
    key's slot it holds stays its own."""
    tasks = {"p.paced": paced, "p.one": one_at_a_time}
    with timers.Timers(fake) as producer:
        producer.schedule(task, [1], in_=-1, id="t0")
    asked: list[GateRun] = []

    async def scenario() -> list[str]:
        client, scripts = _watched_gate(fake, asked)
        flow = FlowGate(scripts, 30.0, on_held=lambda count: None, shards=1, shard=0)
        reply = await scripts.claim(limit=5, lease_ms=30_000, horizon_ms=0, listener_id="me")
        run = Run.parse(*reply[3:6])
        said = []
        for _ in range(2):
            admission = await flow.admit(run, run.record(), policy_of(tasks[task]))
            said.append("go" if admission.held is None else admission.held.error_type)
        await client.aclose()
        return said

    assert asyncio.run(scenario()) == ["go", "go"]
    assert len(asked) == asks


@timers.task(rate="1/s")
def once_a_second(n: int) -> None: ...


def test_a_renewal_between_the_gate_holding_a_run_back_and_the_listener_reading_it_warns_of_no_loss(
    fake: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The gate takes a run it holds back out of the running set in Redis; a renewal that
    runs before the listener has read that reply finds the run gone. Nothing was lost (the
    run waits for its rate), so the renewal must not warn that another listener took it
    over; the run let go keeps its lease, and its loss later is warned of."""
    with timers.Timers(fake) as producer:
        for n in range(2):
            producer.schedule("p.once", [n], in_=-1, id=f"t{n}")
    held = HeldRuns(30.0)
    keeper = LeaseKeeper(fakeredis.FakeRedis(server=fake.connection_pool.connection_kwargs[
        "server"]), Keyspace(), 30.0, held)

    async def scenario() -> list[str]:
        client = fakeredis.FakeAsyncRedis(server=fake.connection_pool.connection_kwargs["server"])
        scripts = Scripts(client, Keyspace())
        gate = scripts.gate

        async def renewed_before_read(lease_ms: int, runs: list[GateRun]) -> Any:
            reply = await gate(lease_ms, runs)
            keeper.renew_once()  # the keeper's thread, before the loop reads the reply
            return reply

        scripts.gate = renewed_before_read  # type: ignore[method-assign]
        flow = FlowGate(scripts, 30.0, on_held=lambda count: None, shards=1, shard=0,
                        held=held)
        reply = await scripts.claim(limit=5, lease_ms=30_000, horizon_ms=0, listener_id="me")
        runs = [Run.parse(*reply[i:i + 3]) for i in range(3, len(reply), 3)]
        for run in runs:
            held.hold(run.token, run.timer_id)
        said = await asyncio.gather(*(flow.admit(run, run.record(), policy_of(once_a_second))
                                      for run in runs))
        await client.aclose()
        return [run.token for run, admission in zip(runs, said, strict=True)
                if admission.held is None]

    with caplog.at_level("WARNING", logger="timers.listener"):
        [went] = asyncio.run(scenario())
    assert not [r for r in caplog.records if "recovered elsewhere" in r.getMessage()]
    assert held.tokens() == [went] and held.fresh(went)
    fake.zrem(Keyspace().running, went)  # the run let go, taken over after all: that is a loss
    with caplog.at_level("WARNING", logger="timers.listener"):
        keeper.renew_once()
    keeper.client.close()
    assert [r for r in caplog.records if "recovered elsewhere" in r.getMessage()]
