"""Which due timers the listener's parker hands to park.lua: those a gate would weigh by
their concurrency key alone, with the key the gate would compute."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import redis

import timers
from timers.listener.claimer import Claimer
from timers.listener.flow_gate import FlowGate
from timers.listener.parker import Parker
from timers.scripts import ParkTimer


@timers.task(concurrency=1, key=lambda device, cmd: f"device:{device}")
def per_device(device: int, cmd: str) -> None: ...


@timers.task(concurrency=3)
def capped() -> None: ...


@timers.task(concurrency=1, key=lambda n: "k", rate="10/s")
def keyed_and_rated(n: int) -> None: ...


@timers.task(concurrency=1, key=lambda n: "k", group="video")
def video(n: int) -> None: ...


@timers.task(concurrency=1, key=lambda: 1 / 0)
def broken() -> None: ...


def plain() -> None: ...


TASKS: dict[str, Any] = {"d.per_device": per_device, "d.capped": capped, "d.plain": plain,
                         "d.rated": keyed_and_rated, "d.video": video, "d.broken": broken}


def resolve(task: str) -> Any:
    return TASKS[task]  # KeyError: a task this listener cannot import


@pytest.fixture
def parker() -> Parker:
    return Parker(None, ("default",), 30.0, resolve, FlowGate(None, 30.0))  # type: ignore[arg-type]


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

    flow = FlowGate(None, 30.0)  # type: ignore[arg-type]
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
