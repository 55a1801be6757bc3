"""Releases that disagree on a task's group: a timer moves a bounded number of times, then
waits in its group, saying why (``timers/model/flow/disagreement.py``), through the real
listener and scripts on an in-memory server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest

import timers
from timers import Listener, Timers
from timers.model.encoding import Record
from timers.model.flow import disagreement
from timers.model.keys import Keyspace
from timers.model.wire import Option


@timers.task(group="b")
def _says_b(tag: str) -> None:
    """The release of listener A (serves group a): the task is in group b."""


@timers.task(group="a")
def _says_a(tag: str) -> None:
    """The release of listener B (serves group b): the task is in group a."""


RAN: list[str] = []


@timers.task(group="b")
def _agrees(tag: str) -> None:
    """A later release of group b's listener, which agrees with where the timer waits."""
    RAN.append(tag)


@pytest.fixture
def producer(server: fakeredis.FakeServer) -> Iterator[Timers]:
    with Timers(fakeredis.FakeRedis(server=server), group="a") as t:
        yield t


def burst(server: fakeredis.FakeServer, group: str, task: Callable[..., Any]) -> None:
    """One listener of ``group`` whose release has ``task`` as jobs.work: run what is due."""
    async def run() -> None:
        listener = Listener(fakeredis.FakeAsyncRedis(server=server), groups=[group],
                            registry={"jobs.work": task})
        await asyncio.wait_for(listener.run(burst=True), 15)
        await listener.redis.aclose()

    asyncio.run(run())


def record(t: Timers, timer_id: str) -> Record:
    value = t.redis.hget(Keyspace().records, timer_id)
    assert value is not None, f"{timer_id} is not pending"
    return Record.decode(value.decode())


def bounce(server: fakeredis.FakeServer) -> None:
    """A and B each run what is due to them, twice over."""
    for _ in range(2):
        burst(server, "a", _says_b)
        burst(server, "b", _says_a)


def test_a_timer_moves_three_times_then_waits_where_it_is_with_the_reason(
        server: fakeredis.FakeServer, producer: Timers, caplog: pytest.LogCaptureFixture
) -> None:
    producer.schedule("jobs.work", ["x"], in_=0, id="t1")
    producer.schedule("jobs.work", ["y"], in_=0, id="t2")
    with caplog.at_level("WARNING", logger="timers.listener"):
        bounce(server)
        bounce(server)
    for timer_id in ("t1", "t2"):
        stored = record(producer, timer_id)
        assert stored.options[Option.GROUP_MOVES] == str(disagreement.FREE_MOVES)
        assert stored.options[Option.GROUP] == "b"
        assert stored.options[Option.GROUP_DISAGREEMENT] == "a"
        pending = producer.get(timer_id)
        assert pending is not None and pending.wait is not None
        assert pending.wait.kind == "group" and pending.group == "b"
        assert pending.wait.describe().startswith(
            "waiting: group disagreement: task jobs.work says group a, listener serves b")
        left = (pending.due - datetime.now(UTC)).total_seconds()
        assert 50 < left <= disagreement.RECHECK_MS / 1000
        assert pending.waited_from is not None and pending.waited_from < pending.due
    assert producer.stats().counters.get("routed") == 2 * disagreement.FREE_MOVES
    assert producer.stats().fired == 0
    # moved and left waiting, never run: no run, no failure in the task's series
    assert [(m.runs, m.failures) for m in producer.series("jobs.work", 2)] == [(0, 0)] * 2
    warned = [r for r in caplog.records if "group disagreement" in r.getMessage()]
    assert len(warned) == 1, "one warning per task and pair of groups"
    assert "task jobs.work says group a, listener serves b" in warned[0].getMessage()


def test_after_each_wait_it_may_move_once_more_up_to_the_cap_then_only_waits(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    producer.schedule("jobs.work", ["x"], in_=0, id="t1")
    bounce(server)
    moves = []
    for _ in range(2 * disagreement.MAX_MOVES):
        producer.reschedule("t1", in_=0)  # its recheck comes due
        bounce(server)
        moves.append(int(record(producer, "t1").options[Option.GROUP_MOVES]))
    assert moves == sorted(moves) and moves[-1] == disagreement.MAX_MOVES
    assert moves.count(disagreement.MAX_MOVES) > 2, "it stopped moving at the cap"
    assert producer.stats().counters.get("routed") == disagreement.MAX_MOVES
    pending = producer.get("t1")
    assert pending is not None and pending.wait is not None and pending.wait.kind == "group"


def test_a_listener_whose_release_agrees_runs_the_waiting_timer(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    RAN.clear()
    producer.schedule("jobs.work", ["x"], in_=0, id="t1")
    bounce(server)
    assert record(producer, "t1").options[Option.GROUP] == "b"
    producer.reschedule("t1", in_=0)
    burst(server, "b", _agrees)
    assert RAN == ["x"] and producer.get("t1") is None
    assert producer.stats().fired == 1


def test_a_move_after_a_wait_no_longer_says_it_waits_and_counts_the_move() -> None:
    waiting = Record.decode(disagreement.waiting(
        Record("jobs.work", ["x"], {Option.GROUP: "b", Option.GROUP_MOVES: "3"}), "a", 5))
    assert disagreement.Disagreement.of(waiting) == disagreement.Disagreement("jobs.work", "a",
                                                                              "b")
    assert waiting.options[Option.WAITED_FROM] == "5"
    assert disagreement.may_move(waiting)
    moved = Record.decode(disagreement.moved(waiting, "a"))
    assert Option.GROUP_DISAGREEMENT not in moved.options
    assert moved.options[Option.GROUP_MOVES] == "4" and moved.options[Option.GROUP] == "a"
    assert not disagreement.may_move(moved)


@timers.task(group="b")
def _fails_in_b(tag: str) -> None:
    """A task of a declared group that fails (no retries)."""
    raise RuntimeError(f"boom {tag}")


@timers.task(group="b", retries=2, backoff=[60])
def _fails_in_b_retried(tag: str) -> None:
    """The same, with retries."""
    raise RuntimeError(f"boom {tag}")


def test_a_failure_of_a_task_of_a_declared_group_is_a_failure_not_a_disagreement(
        server: fakeredis.FakeServer) -> None:
    """Only a group disagreement leaves a timer waiting in its group: a task of a declared
    group that raises is recorded dead, or waits for its retry, as any task's run."""
    with Timers(fakeredis.FakeRedis(server=server), group="b") as t:
        t.schedule("jobs.work", ["x"], in_=0, id="dead")
        burst(server, "b", _fails_in_b)
        assert t.get("dead") is None, "a failure for good is not left pending"
        failure = t.get_failure("dead")
        assert failure is not None and "boom x" in str(failure.data)

        t.schedule("jobs.work", ["y"], in_=0, id="retried")
        burst(server, "b", _fails_in_b_retried)
        pending = t.get("retried")
        assert pending is not None and pending.attempts == 1, "waits for its retry"
        assert Option.GROUP_DISAGREEMENT not in record(t, "retried").options
