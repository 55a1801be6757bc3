"""A producer whose idle connections the server dropped (a restart, Redis's ``timeout``
setting, a proxy closing idle sockets) reconnects on its next call instead of failing it."""

from __future__ import annotations

import asyncio

import pytest
import redis

from timers import AsyncTimers, Timers

pytestmark = pytest.mark.integration


def _drop_every_other_client(r: redis.Redis) -> None:
    """What a restart or an idle timeout does to the producer's pooled connections."""
    r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


def test_an_async_producer_reconnects_after_its_connections_were_dropped(
        redis_url: str, r: redis.Redis) -> None:
    async def scenario() -> list[str]:
        async with AsyncTimers(redis_url) as t:
            ids = list(await asyncio.gather(*(t.schedule("a.b", in_=60) for _ in range(5))))
            for _ in range(3):
                _drop_every_other_client(r)
                ids.append(await t.schedule("a.b", in_=60))
                ids += await t.schedule_many([{"task": "a.b", "in_": 60}] * 2)
            return ids

    ids = asyncio.run(scenario())
    assert r.zcard("timers|due") == len(set(ids)) == 14


def test_a_sync_producer_reconnects_after_its_connections_were_dropped(
        redis_url: str, r: redis.Redis) -> None:
    with Timers(redis_url) as t:
        ids = [t.schedule("a.b", in_=60)]
        for _ in range(3):
            _drop_every_other_client(r)
            ids.append(t.schedule("a.b", in_=60))
            ids += t.schedule_many([{"task": "a.b", "in_": 60}] * 2)
    assert r.zcard("timers|due") == len(set(ids)) == 10
