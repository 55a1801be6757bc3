"""Poison timers: a run whose listener died counts a crash; at the task's limit the timer is
recorded dead ("its listener went away N times while holding it (last: listener host:pid)"),
not run."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

from tests.unit.helpers import claim
from tests.unit.sample_tasks import mod
from tests.unit.test_listener_unit import make_listener
from timers import Timers, task
from timers.listener.crashes import crash_outcome, died_outcome, listener_name
from timers.listener.quarantine import how_it_died
from timers.model.keys import Keyspace
from timers.model.policy import TaskPolicy, policy_of
from timers.model.runs import Run
from timers.store.scripts import register_all

PAST = datetime(2001, 1, 1, tzinfo=UTC)


def crash(fake: fakeredis.FakeRedis, ks: Keyspace, scripts: dict[str, Any], by: str) -> str:
    """Claim the due timer as listener ``by`` and let it die: its lease lapses."""
    (claimed,) = claim(scripts, ks, listener=by).claimed
    fake.zadd(ks.running, {claimed.token: 0}, xx=True)
    return claimed.died_on


def test_the_claim_counts_crashes_and_names_the_listener_that_died(
        producer: Timers, scripts: dict[str, Any], ks: Keyspace,
        fake: fakeredis.FakeRedis) -> None:
    producer.schedule("a.b", [1], at=PAST, id="t")
    assert crash(fake, ks, scripts, "host-a:11:aa") == ""
    assert crash(fake, ks, scripts, "host-b:22:bb") == "host-a:11:aa"
    (third,) = claim(scripts, ks, listener="host-c:33:cc").claimed
    assert (third.source, third.reruns, third.died_on) == ("r", 2, "host-b:22:bb")
    run = Run.parse(third.token, third.run, "r@" + third.died_on)
    assert (run.reruns, run.died_on, run.source) == (2, "host-b:22:bb", "recovered")


def test_the_crash_limit_ends_a_run_as_dead() -> None:
    policy = TaskPolicy(max_crashes=3)
    run = Run("1", "t", "a.b:[]", 0, 2, "recovered", "web-1:4242:ab12cd")
    assert crash_outcome(run, policy) is None
    dead = crash_outcome(Run("1", "t", "a.b:[]", 0, 3, "recovered", "web-1:4242:ab12cd"),
                         policy)
    assert dead is not None and dead.kind == "crashed"
    assert dead.message == ("its listener went away 3 times while holding it "
                            "(last: listener web-1:4242)")
    assert listener_name("web-1:4242:ab12cd") == "web-1:4242"


def test_a_dead_timers_message_counts_each_kind_of_crash_for_what_it_was() -> None:
    assert died_outcome(3, "exit code 1 on h:1").message == (
        "its process died 3 times in quarantine (last: exit code 1 on h:1)")
    assert died_outcome(1, "exit code 1 on h:1", lapses=1, before_start=1).message == (
        "its process died once in quarantine (last: exit code 1 on h:1), 1 quarantine "
        "process(es) died before starting it, after its listener went away once while "
        "holding it")


def test_max_crashes_is_a_task_option() -> None:
    @task(max_crashes=1)
    def fragile() -> None: ...

    assert policy_of(fragile).max_crashes == 1
    assert TaskPolicy().max_crashes == 3
    with pytest.raises(ValueError, match="max_crashes"):
        TaskPolicy(max_crashes=0)


def test_a_listener_records_a_poison_timer_dead_instead_of_running_it() -> None:
    """At its crash limit a run is recorded dead at the claim (a rerun below the limit runs
    in quarantine, a process: tests/integration/test_quarantine.py)."""
    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    ks, scripts = Keyspace(), register_all(fake)
    producer = Timers(fake)
    producer.schedule("mod.add", [1, 2], at=PAST, id="poison")
    mod.CALLS.clear()
    for i in range(3):
        crash(fake, ks, scripts, f"web-{i}:{100 + i}:ab")

    async def scenario() -> None:
        listener = make_listener(server)
        await asyncio.wait_for(listener.run(burst=True), 15)
        await listener.redis.aclose()

    asyncio.run(scenario())
    assert mod.CALLS == [], "a suspect run never runs in the listener process"
    stats = producer.stats()
    assert (stats.pending, stats.running, stats.fired, stats.failed) == (0, 0, 0, 1)
    (failure,) = producer.failed()
    assert failure.timer_id == "poison"
    assert failure.data["message"] == ("its listener went away 3 times while holding it "
                                       "(last: listener web-2:102)")
    mod.CALLS.clear()


def test_how_a_process_died_reads_well() -> None:
    assert how_it_died(-11) == "killed by SIGSEGV"
    assert how_it_died(1) == "exit code 1"
