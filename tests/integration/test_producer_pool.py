"""Producers under concurrency: a client made from a URL waits for a free connection
instead of failing when many calls run at once (a web app's burst of requests)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from tests.conftest import wait_until_async
from timers import AsyncTimers, PoolExhausted, Timers

pytestmark = pytest.mark.integration


def test_five_hundred_concurrent_async_schedules_all_succeed_with_the_defaults(
        redis_url: str, r: redis.Redis) -> None:
    async def burst() -> list[str]:
        async with AsyncTimers(redis_url) as t:
            return list(await asyncio.gather(*(
                t.schedule("reminders.sms", {"user_id": i}, in_=3600) for i in range(500))))

    ids = asyncio.run(burst())
    assert len(set(ids)) == 500
    assert r.zcard("timers|due") == 500


def test_three_hundred_threads_scheduling_at_once_all_succeed_with_the_defaults(
        redis_url: str, r: redis.Redis) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(300)
    with Timers(redis_url) as t:
        def schedule(i: int) -> None:
            start.wait()
            try:
                t.schedule("reminders.sms", {"user_id": i}, in_=3600)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=schedule, args=(i,)) for i in range(300)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert r.zcard("timers|due") == 300


async def _until_a_script_waits_on(server: redis.Redis, within: float = 10.0) -> None:
    script_commands = ("function|load", "fcall", "evalsha", "eval")
    await wait_until_async(
        lambda: any(c.get("cmd") in script_commands for c in server.client_list()), within,
        message="a script call to reach the paused server")


def test_a_pool_that_stays_busy_past_its_wait_raises_pool_exhausted_and_writes_nothing(
        redis_url: str, r: redis.Redis, paused: redis.Redis) -> None:
    async def two_calls() -> tuple[object, object]:
        async with AsyncTimers(f"{redis_url}?max_connections=1&timeout=0.2") as t:
            paused.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
            first = asyncio.create_task(t.schedule("reminders.sms", {"n": 1}, in_=3600,
                                                   id="holds-the-connection"))
            await _until_a_script_waits_on(paused)  # the first call holds the connection
            second = await asyncio.gather(
                t.schedule("reminders.sms", {"n": 2}, in_=3600, id="finds-none"),
                return_exceptions=True)
            return await first, second[0]

    first, second = asyncio.run(two_calls())
    assert first == "holds-the-connection"
    assert isinstance(second, PoolExhausted)
    assert isinstance(second, ConnectionError)
    assert "all 1 of the client's connections were in use" in str(second)
    assert "max_connections" in str(second)
    assert r.zscore("timers|due", "finds-none") is None
