"""Inside a :class:`TimersTest` (the ``timers_test`` fixture) every client the app makes
goes to the test's in-memory server: ``Timers()``, ``AsyncTimers()``, from a URL or from
none; a client made before the test, or on a redis-py client of the app's own, refuses
its first call instead of writing to a real Redis. Nothing here connects anywhere."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest
import redis
import redis.asyncio

from timers import AsyncTimers, Timers, TimersError
from timers.store import connect
from timers.testing import TimersTest

NOWHERE = "redis://nowhere.invalid:1/0"  # a test that reached it would fail to resolve


def test_timers_made_inside_the_test_go_to_its_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_REDIS_URL", NOWHERE)
    with TimersTest() as t:
        with Timers() as from_env, Timers(NOWHERE, prefix=t.timers.keys.prefix) as from_url:
            from_env.schedule("reminders.sms", [1], in_=60, id="from-env")
            from_url.schedule("reminders.sms", [2], in_=60, id="from-url")
            assert isinstance(from_env.redis, fakeredis.FakeRedis)
        assert sorted(p.id for p in t.pending()) == ["from-env", "from-url"]


def test_async_timers_made_inside_the_test_go_to_its_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMERS_REDIS_URL", NOWHERE)

    async def app_lifespan() -> str:
        async with AsyncTimers() as client:  # as the web apps guide's FastAPI lifespan does
            return await client.schedule("reminders.sms", [3], in_=60)

    with TimersTest() as t:
        tid = asyncio.run(app_lifespan())
        assert [p.id for p in t.pending()] == [tid]


def test_a_client_made_before_the_test_refuses_to_write_elsewhere() -> None:
    before = Timers(NOWHERE)  # (no connection is made until a call)
    with TimersTest() as t:
        with pytest.raises(TimersError, match="not the timers test's in-memory server"):
            before.schedule("reminders.sms", [1], in_=60)
        assert t.pending() == []
    before.close()


def test_a_redis_client_of_the_apps_own_is_refused_sync_and_async() -> None:
    with TimersTest():
        own = Timers(redis.Redis.from_url(NOWHERE))
        with pytest.raises(TimersError, match="made before the test began, or given"):
            own.cancel("x")

        async def use_async() -> None:
            mine = AsyncTimers(redis.asyncio.Redis.from_url(NOWHERE))
            with pytest.raises(TimersError, match=r"timers_test\.timers"):
                await mine.cancel("x")

        asyncio.run(use_async())


def test_after_the_test_clients_are_real_again_and_nesting_restores() -> None:
    with TimersTest() as outer:
        with TimersTest() as inner:
            Timers().schedule("reminders.sms", [1], in_=60, id="inner")
            assert [p.id for p in inner.pending()] == ["inner"]
        Timers().schedule("reminders.sms", [1], in_=60, id="outer")
        assert [p.id for p in outer.pending()] == ["outer"]
    assert connect.in_memory_server is None
    real = Timers(NOWHERE)
    assert not isinstance(real.redis, fakeredis.FakeRedis)
    real.close()
