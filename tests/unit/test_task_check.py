"""A producer scheduling a task no live listener announces (a typo such as
``reminders.smss``): it warns once per task and group, naming the nearest announced paths;
``strict_tasks=True`` refuses with nothing written; no live listener at all says nothing.
The announced tasks are read once per task and group: every later timer of it costs no
round trip more (fakeredis, a listener's heartbeat written as a listener writes it)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from timers import AsyncTimers, Timers, TimerSpec
from timers.exceptions import InvalidTimer
from timers.model.keys import Keyspace
from timers.ops import fleet

KS = Keyspace()
ANNOUNCED = ["reminders.sms", "reminders.email", "orders.expire_unpaid"]


def announce(fake: fakeredis.FakeRedis, tasks: list[str], groups: list[str] | None = None,
             listener: str = "h:1:ab", keys: Keyspace = KS) -> None:
    """A live listener's heartbeat in ``keys``, naming the digest of ``tasks`` (stored
    once)."""
    digest = fleet.task_set_digest(tasks)
    fake.zadd(keys.listeners, {listener: 2 ** 50})
    fake.hset(keys.listener_info, listener, json.dumps(
        {"id": listener, "tasks": "tasks", "groups": groups or ["default"],
         "task_set": digest}))
    fake.hset(keys.task_sets, digest, fleet.encode_task_set(tasks))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a client read the listeners' announced tasks."""
    counted: list[int] = []
    read_fleet = fleet.read_fleet

    def counting(keys: Keyspace) -> Any:
        counted.append(1)
        return read_fleet(keys)

    monkeypatch.setattr(fleet, "read_fleet", counting)  # (task_check imports it when it asks)
    return counted


@pytest.fixture
def producer(fake: fakeredis.FakeRedis) -> Iterator[Timers]:
    with Timers(fake) as t:
        t.warn_in_event_loop = False
        yield t


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "timers.producer" and r.levelno == logging.WARNING]


def test_a_typo_warns_once_with_the_nearest_name_and_costs_one_read(
        fake: fakeredis.FakeRedis, producer: Timers, reads: list[int],
        caplog: pytest.LogCaptureFixture) -> None:
    announce(fake, ANNOUNCED)
    for i in range(100):
        producer.schedule("reminders.smss", [i], in_=60)
    (said,) = warnings_of(caplog)
    assert said.startswith("no live listener announces task 'reminders.smss' in group "
                           "default: did you mean 'reminders.sms'")
    assert "live listeners: h:1:ab (package 'tasks', groups default)" in said
    assert len(reads) == 1  # the first call only
    assert len(producer.list(200)) == 100  # warned, not refused


def test_an_announced_task_says_nothing_and_is_read_once(
        fake: fakeredis.FakeRedis, producer: Timers, reads: list[int],
        caplog: pytest.LogCaptureFixture) -> None:
    announce(fake, ANNOUNCED)
    for i in range(50):
        producer.schedule("reminders.sms", [i], in_=60)
        producer.schedule("orders.expire_unpaid", [i], in_=60)
    assert warnings_of(caplog) == [] and len(reads) == 2  # once per task


def test_no_live_listener_says_nothing(producer: Timers, reads: list[int],
                                       caplog: pytest.LogCaptureFixture) -> None:
    producer.schedule("anything.at_all", in_=60)
    producer.schedule("anything.at_all", in_=60)
    assert warnings_of(caplog) == [] and len(reads) == 1


def test_a_group_no_live_listener_serves_is_said(
        fake: fakeredis.FakeRedis, producer: Timers, caplog: pytest.LogCaptureFixture) -> None:
    announce(fake, ANNOUNCED, groups=["billing"])
    producer.schedule("reminders.sms", in_=60)
    producer.schedule("reminders.sms", in_=60, group="billing")
    (said,) = warnings_of(caplog)
    assert said.startswith("no live listener announces task 'reminders.sms' in group "
                           "default: no live listener serves group 'default'")


def test_strict_tasks_refuses_and_writes_nothing(fake: fakeredis.FakeRedis,
                                                 reads: list[int]) -> None:
    announce(fake, ANNOUNCED)
    with Timers(fake, strict_tasks=True) as t:
        t.warn_in_event_loop = False
        with pytest.raises(InvalidTimer, match=r"did you mean 'reminders\.sms'"):
            t.schedule("reminders.smss", [1], in_=60)
        with pytest.raises(InvalidTimer, match=r"'orders\.expire_unpiad'"):
            t.schedule_many([TimerSpec("reminders.sms", [1], in_=60),
                             {"task": "orders.expire_unpiad", "args": [2], "in_": 60}])
        assert t.list() == []
        assert t.schedule("reminders.sms", [3], in_=60)  # a known one is written
        assert [x.task for x in t.list()] == ["reminders.sms"]


def test_schedule_many_checks_each_task_once_from_a_generator(
        fake: fakeredis.FakeRedis, producer: Timers, reads: list[int],
        caplog: pytest.LogCaptureFixture) -> None:
    announce(fake, ANNOUNCED)
    ids = producer.schedule_many(TimerSpec(task, [i], in_=60) for i in range(10)
                                 for task in ("reminders.sms", "reminders.emial"))
    assert len(ids) == 20 and len(reads) == 1
    (said,) = warnings_of(caplog)
    assert "'reminders.emial'" in said and "did you mean 'reminders.email'" in said


def test_the_asyncio_producer_warns_once_too(
        fake: fakeredis.FakeRedis, reads: list[int], caplog: pytest.LogCaptureFixture) -> None:
    announce(fake, ANNOUNCED)
    after_first: list[int] = []

    async def scenario() -> None:
        server = fake.connection_pool.connection_kwargs["server"]
        async with AsyncTimers(fakeredis.FakeAsyncRedis(server=server)) as t:
            # first calls in flight at once may each read; one warning whatever their number
            await asyncio.gather(*(t.schedule("reminders.smss", [i], in_=60) for i in range(5)))
            after_first.append(len(reads))
            for i in range(20):
                await t.schedule("reminders.smss", [i], in_=60)

    asyncio.run(scenario())
    assert len(warnings_of(caplog)) == 1
    assert len(reads) == after_first[0] <= 5  # none after the first calls
