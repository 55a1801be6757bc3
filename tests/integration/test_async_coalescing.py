"""``AsyncTimers.schedule`` calls in flight at once share round trips on a real server, and
each caller still gets its own id or its own error (see :mod:`timers.producer.coalesce`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from tests.integration.helpers import KEYS
from timers import AsyncTimers, ServerOutOfMemory, ServerUnavailable
from timers.dev.server import EmbeddedServer
from timers.exceptions import InvalidArgs, InvalidTask

pytestmark = pytest.mark.integration


def script_calls(r: redis.Redis) -> int:
    """Script calls (FCALL, EVALSHA, EVAL) the server has run so far."""
    stats = r.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0)
               for name in ("fcall", "evalsha", "eval"))


def test_100_calls_in_flight_are_one_script_call_and_each_gets_its_own_timer(
        r: redis.Redis, redis_url: str) -> None:
    async def scenario() -> list[str]:
        async with AsyncTimers(redis_url) as t:
            # connections open, script loaded, the task looked up among the listeners'
            # (its first call reads the fleet once)
            await t.schedule("mail.send", ["warm"], in_=3600)
            before = script_calls(r)
            ids = await asyncio.gather(*(t.schedule("mail.send", [i], in_=3600)
                                         for i in range(100)))
            # the first goes to the wire at once, alone; the 99 made while it is in flight
            # share one script call
            assert script_calls(r) - before == 2, "100 concurrent calls were not coalesced"
            for i in (0, 57, 99):
                timer = await t.get(ids[i])
                assert timer is not None and timer.args == [i]
            return ids

    ids = asyncio.run(scenario())
    assert len(set(ids)) == 100
    assert r.zcard(KEYS.due) == 101


def test_a_bad_call_fails_alone_and_the_others_are_written(
        r: redis.Redis, redis_url: str) -> None:
    async def scenario() -> list[object]:
        async with AsyncTimers(redis_url) as t:
            calls = [t.schedule("mail.send", [i], in_=60) for i in range(5)]
            calls.insert(2, t.schedule("mail.send", [object()], in_=60))  # not JSON
            calls.insert(4, t.schedule("not a path", in_=60))
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(scenario())
    assert isinstance(results[2], InvalidArgs) and isinstance(results[4], InvalidTask)
    written = [res for i, res in enumerate(results) if i not in (2, 4)]
    assert all(isinstance(res, str) for res in written), written
    assert r.zcard(KEYS.due) == 5


def test_a_cancelled_caller_writes_nothing_and_the_rest_of_its_turn_goes(
        r: redis.Redis, redis_url: str) -> None:
    async def scenario() -> None:
        async with AsyncTimers(redis_url) as t:
            # the client's first write reads the server's eviction policy first (a round
            # trip): after it, a call queues its timer in its first step
            await t.schedule("mail.send", ["first"], in_=60)
            lone = asyncio.ensure_future(t.schedule("mail.send", ["lone"], in_=60))
            await asyncio.sleep(0)  # one turn of the loop (no time): the lone call is sent
            kept = asyncio.ensure_future(t.schedule("mail.send", ["kept"], in_=60, id="kept"))
            dropped = asyncio.ensure_future(t.schedule("mail.send", ["x"], in_=60, id="gone"))
            await asyncio.sleep(0)  # one more turn: both queue in it, behind the lone call
            assert len(t._coalescer._queue) == 2, "both calls queued for the same turn"
            dropped.cancel()
            assert await kept == "kept"
            assert isinstance(await lone, str)
            with pytest.raises(asyncio.CancelledError):
                await dropped
            assert await t.get("gone") is None

    asyncio.run(scenario())


@pytest.fixture
def full(r: redis.Redis) -> Iterator[None]:
    old = r.config_get("maxmemory*")
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        yield
    finally:
        r.config_set("maxmemory", old["maxmemory"])
        r.config_set("maxmemory-policy", old["maxmemory-policy"])


def test_on_a_full_server_every_caller_gets_its_own_out_of_memory_and_none_is_written(
        r: redis.Redis, redis_url: str, full: None) -> None:
    async def scenario() -> list[object]:
        async with AsyncTimers(redis_url) as t:
            return await asyncio.gather(*(t.schedule("mail.send", [i], in_=60)
                                          for i in range(20)), return_exceptions=True)

    results = asyncio.run(scenario())
    assert all(isinstance(res, ServerOutOfMemory) for res in results), results
    assert len({id(res) for res in results}) == 20, "callers share one exception object"
    assert all(res.written == [] for res in results if isinstance(res, ServerOutOfMemory))
    assert r.zcard(KEYS.due) == 0


def test_with_redis_gone_every_caller_gets_its_own_error_and_later_calls_work(
        r: redis.Redis) -> None:
    server = EmbeddedServer().start()
    url = server.url

    async def scenario() -> None:
        async with AsyncTimers(url) as t:
            await t.schedule("warm.up", in_=60)
            server.stop(keep_data=True)
            results = await asyncio.gather(*(t.schedule("mail.send", [i], in_=60)
                                             for i in range(10)), return_exceptions=True)
            assert all(isinstance(res, ServerUnavailable) for res in results), results
            assert len({id(res) for res in results}) == 10
            server.start()
            assert len(set(await asyncio.gather(*(t.schedule("mail.send", [i], in_=60)
                                                  for i in range(10))))) == 10
            assert (await t.stats()).pending == 11

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
