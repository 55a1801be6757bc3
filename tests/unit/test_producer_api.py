"""The producer API as a user meets it (issue 10, bugs 2, 6 and 7): reserved occurrence
ids, a batch error that names its timer, and ``timers.aio`` complete after ``import timers``.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest

import timers
from timers import (
    AsyncTimers,
    InvalidArgs,
    InvalidDueTime,
    InvalidTimerId,
    Timers,
    TimerSpec,
)
from timers.ops.failures import Failure

# -- bug 6: the occurrence id form is reserved ------------------------------------------


def test_a_user_id_of_the_occurrence_form_is_refused_and_the_occurrence_kept(
    producer: Timers,
) -> None:
    """It silently replaced the pending occurrence of ``daily``, ending its chain."""
    rec = producer.every("daily", "reports.daily", cron="0 9 * * *")
    assert rec.next_due is not None
    occurrence = f"daily@{int(rec.next_due.timestamp() * 1000)}"
    assert producer.get(occurrence) is not None

    with pytest.raises(InvalidTimerId, match=r"reserved for the occurrences of recurrences"):
        producer.schedule("other.task", [1], in_=60, id=occurrence)
    with pytest.raises(InvalidTimerId, match=r"timer 1 \(id 'x@5'\): timer id 'x@5'"):
        producer.schedule_many([TimerSpec("a.b", in_=1, id="ok"), {"task": "a.b", "in_": 1,
                                                                    "id": "x@5"}])

    kept = producer.get(occurrence)
    assert kept is not None and kept.task == "reports.daily"
    assert producer.get("ok") is None  # all or nothing


@pytest.mark.parametrize("tid", ["user@example.com", "@5", "x@", "x@5a", "order-42", "a@b@c"])
def test_ids_not_of_the_occurrence_form_are_still_accepted(producer: Timers, tid: str) -> None:
    producer.schedule("a.b", in_=60, id=tid)
    assert producer.get(tid) is not None


def test_a_failed_occurrence_is_still_retried_under_its_own_id(producer: Timers) -> None:
    failure = Failure("daily@1767261600000:tok", datetime.now(UTC),
                      {"task": "reports.daily", "id": "daily@1767261600000", "args": None})
    assert producer.retry_failure(failure) == "daily@1767261600000"
    assert producer.get("daily@1767261600000") is not None


# -- bug 7: a refused batch names the timer ----------------------------------------------


def test_a_refused_batch_names_the_index_the_id_and_the_reason(producer: Timers) -> None:
    specs: list[TimerSpec | dict[str, object]] = [
        TimerSpec("a.b", [1], in_=1), TimerSpec("a.b", [2], in_=1),
        TimerSpec("a.b", [3], in_=1), TimerSpec("a.b", [object()], in_=1, id="x"),
    ]
    with pytest.raises(InvalidArgs, match=r"^timer 3 \(id 'x'\): args must be JSON-serial"):
        producer.schedule_many(specs)
    with pytest.raises(InvalidDueTime, match=r"^timer 1: "):
        producer.schedule_many([{"task": "a.b", "in_": 1}, {"task": "a.b"}])
    assert producer.list() == []  # nothing written


def test_a_single_schedule_error_is_not_numbered(producer: Timers) -> None:
    with pytest.raises(InvalidArgs, match=r"^args must be JSON-serialisable"):
        producer.schedule("a.b", [object()], in_=1)


# -- bug 2: timers.aio after a plain `import timers` -----------------------------------


def test_timers_aio_has_every_module_level_function_of_timers() -> None:
    # task, registered and current (a running task's context) serve both worlds as they are
    not_producer = {"task", "registered", "current"}
    functions = {n for n in timers.__all__ if n.islower() and n not in not_producer}
    assert functions <= set(timers.aio.__all__)


def test_timers_aio_declares_pauses_resumes_and_removes_recurrences() -> None:
    server = fakeredis.FakeServer()

    async def main() -> None:
        timers.aio.configure(fakeredis.aioredis.FakeRedis(server=server))
        rec = await timers.aio.every("tick", "a.b", interval=60)
        assert rec.version == 1 and await timers.aio.pause("tick")
        assert await timers.aio.resume("tick")
        assert await timers.aio.unschedule_recurring("tick")
        assert not await timers.aio.unschedule_recurring("tick")

    try:
        asyncio.run(main())
    finally:
        timers.aio.configure()  # the next test makes its own


# -- bug 4: a client made from a URL does not wait forever -------------------------------


@pytest.mark.parametrize("make", [Timers, timers.AsyncTimers])
def test_a_client_made_from_a_url_times_out_unless_the_url_says_otherwise(make: type) -> None:
    """Without a socket timeout a server that never answers hung the producer for good."""
    made = make("redis://127.0.0.1:1/0").redis.connection_pool.connection_kwargs
    assert (made["socket_connect_timeout"], made["socket_timeout"]) == (5, 15)
    chosen = make("redis://127.0.0.1:1/0?socket_timeout=0.5").redis.connection_pool
    assert chosen.connection_kwargs["socket_timeout"] == 0.5


@pytest.mark.parametrize("make", [Timers, AsyncTimers])
@pytest.mark.parametrize("size", [0, -1, 2.5, True])
def test_a_pool_of_no_connections_is_refused_in_one_line(make: Any, size: Any) -> None:
    with pytest.raises(ValueError, match=r"^max_connections= must be a whole number of "
                                         r"connections, 1 or more, got " + re.escape(repr(size))):
        make("redis://localhost:6379/0", max_connections=size)


@pytest.mark.parametrize("make", [Timers, AsyncTimers])
@pytest.mark.parametrize("size", ["0", "-3", "abc", ""])
def test_a_url_asking_for_a_pool_of_no_connections_is_refused_in_one_line(
        make: Any, size: str) -> None:
    with pytest.raises(ValueError, match=r"^\?max_connections= in the Redis URL must be a "
                                         r"whole number of connections"):
        make(f"redis://localhost:6379/0?max_connections={size}")


def test_a_url_pool_size_is_taken_as_given() -> None:
    t = Timers("redis://localhost:6379/0?max_connections=7", max_connections=3)
    assert t.redis.connection_pool.max_connections == 7
