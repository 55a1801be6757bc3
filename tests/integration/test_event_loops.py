"""Asyncio producers and event loops: ``timers.aio`` keeps one client per loop (two
``asyncio.run`` in turn both work, and each loop's connections close when it ends); an
explicit :class:`AsyncTimers` belongs to the loop that first used it and refuses another
before sending anything."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

import timers
import timers.aio
from tests.conftest import wait_until
from timers import AsyncTimers, WrongEventLoop

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def _named(redis_url: str, name: str) -> str:
    return f"{redis_url.split('?')[0]}?client_name={name}"


def _connections(r: redis.Redis, name: str) -> int:
    return sum(1 for c in r.client_list() if c.get("name") == name)


@pytest.fixture
def fresh_aio_default() -> Iterator[None]:
    yield
    timers.aio.configure()  # the next test makes its own


def test_the_aio_default_works_from_two_event_loops_in_turn(
        redis_url: str, r: redis.Redis, fresh_aio_default: None) -> None:
    timers.aio.configure(_named(redis_url, "aio-default"))

    async def schedule(tid: str) -> str:
        return await timers.aio.schedule("record.hit", [tid], in_=3600, id=tid)

    assert asyncio.run(schedule("first")) == "first"
    # the first loop's client was closed as that loop ended
    wait_until(lambda: _connections(r, "aio-default") == 0, message="the first loop's client")
    assert asyncio.run(schedule("second")) == "second"
    with timers.Timers(redis_url) as t:
        assert {p.id for p in t.list()} == {"first", "second"}


def test_an_async_timers_used_from_a_second_loop_says_so_and_writes_nothing(
        redis_url: str, r: redis.Redis) -> None:
    client = AsyncTimers(redis_url)
    first_loop = asyncio.new_event_loop()
    try:
        first_loop.run_until_complete(
            client.schedule("record.hit", ["one"], in_=3600, id="on-its-loop"))
        # its pooled connection belongs to first_loop; before, a second loop reused it,
        # wrote the timer and then failed ("attached to a different loop")
        with pytest.raises(WrongEventLoop, match="belongs to another event loop") as caught:
            asyncio.run(client.schedule("record.hit", ["two"], in_=3600, id="from-another"))
        assert "make one per loop" in str(caught.value)
        assert isinstance(caught.value, RuntimeError)
        assert r.zrange("timers|due", 0, -1) == ["on-its-loop"]
        with timers.Timers(redis_url) as t:
            assert t.get("from-another") is None
    finally:
        first_loop.run_until_complete(client.aclose())
        first_loop.close()


def test_aio_configured_with_an_app_client_refuses_a_second_loop_and_writes_nothing(
        redis_url: str, r: redis.Redis, fresh_aio_default: None) -> None:
    async def first() -> None:
        app_client = redis.asyncio.Redis.from_url(redis_url)
        timers.aio.configure(app_client)
        await timers.aio.schedule("record.hit", ["one"], in_=3600, id="first")
        await app_client.aclose()

    asyncio.run(first())
    with pytest.raises(WrongEventLoop, match=r"configure timers\.aio with a URL"):
        asyncio.run(timers.aio.schedule("record.hit", ["two"], in_=3600, id="second"))
    assert r.zrange("timers|due", 0, -1) == ["first"]


def test_aio_aclose_closes_the_loops_default_and_the_next_call_makes_a_new_one(
        redis_url: str, r: redis.Redis, fresh_aio_default: None) -> None:
    timers.aio.configure(_named(redis_url, "aio-aclose"))

    async def main() -> None:
        await timers.aio.schedule("record.hit", ["a"], in_=3600)
        assert _connections(r, "aio-aclose") == 1
        await timers.aio.aclose()
        wait_until(lambda: _connections(r, "aio-aclose") == 0, 5,
                   message="the loop's default client to close")
        assert await timers.aio.cancel("nothing") is False

    asyncio.run(main())


def test_async_with_closes_its_own_client_but_never_the_apps(
        redis_url: str, r: redis.Redis) -> None:
    async def main() -> None:
        async with AsyncTimers(_named(redis_url, "ours")) as t:
            await t.schedule("record.hit", ["a"], in_=3600)
            assert _connections(r, "ours") == 1
        # the server drops a closed connection from CLIENT LIST once it reads the close
        wait_until(lambda: _connections(r, "ours") == 0, 5, message="our connection to close")
        app_client = redis.asyncio.Redis.from_url(redis_url)
        async with AsyncTimers(app_client) as t:
            await t.schedule("record.hit", ["b"], in_=3600)
        assert await app_client.ping(), "the app's client is still open"
        await app_client.aclose()

    asyncio.run(main())


def test_sync_timers_closes_its_pool_on_leaving_with(redis_url: str, r: redis.Redis) -> None:
    with timers.Timers(_named(redis_url, "sync")) as t:
        t.schedule("record.hit", ["a"], in_=3600)
        assert _connections(r, "sync") == 1
    wait_until(lambda: _connections(r, "sync") == 0, message="the sync client to close")
