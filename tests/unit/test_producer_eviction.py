"""A producer reads the server's eviction policy once, on its first write: under
``allkeys-*`` it warns once per client, or, strict, refuses every write (nothing written)."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import fakeredis
import pytest
import redis

from timers import AsyncTimers, EvictionUnsafe, EvictionWarning, Timers
from timers.store.eviction import EvictionGuard, policies


class Server:
    """A stand-in client: CONFIG GET (or, refused, INFO memory) answers ``policy``."""

    def __init__(self, policy: str, config: bool = True, info: bool = True) -> None:
        self.policy, self.config, self.info_allowed = policy, config, info
        self.calls = 0

    def config_get(self, pattern: str) -> dict[str, str]:
        self.calls += 1
        if not self.config:
            raise redis.exceptions.NoPermissionError("NOPERM config")
        return {"maxmemory-policy": self.policy}

    def info(self, section: str) -> dict[str, Any]:
        self.calls += 1
        if not self.info_allowed:
            raise redis.exceptions.ResponseError("unknown command 'INFO'")
        return {"maxmemory_policy": self.policy, "used_memory": 1}


def test_allkeys_warns_once_naming_the_policy_and_why() -> None:
    guard, server = EvictionGuard(), Server("allkeys-lru")
    with pytest.warns(EvictionWarning) as caught:
        for _ in range(3):
            guard.read_sync(server)
            guard.refuse_if_strict()
    assert len(caught) == 1 and server.calls == 1
    message = str(caught[0].message)
    assert "allkeys-lru" in message and "every pending timer lost" in message
    assert "noeviction" in message


@pytest.mark.parametrize("server", [Server("noeviction"), Server("volatile-lru"),
                                    Server("allkeys-lru", config=False, info=False)])
def test_a_safe_or_unknown_policy_says_nothing(server: Server) -> None:
    guard = EvictionGuard(strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.read_sync(server)
        guard.refuse_if_strict()
    assert guard.checked and guard.policy is None


def test_info_is_read_where_config_is_refused() -> None:
    guard = EvictionGuard(strict=True)
    guard.read_sync(Server("allkeys-random", config=False))
    with pytest.raises(EvictionUnsafe, match=r"allkeys-random.*nothing was written"):
        guard.refuse_if_strict()


def test_a_server_that_cannot_be_reached_is_checked_on_the_next_write() -> None:
    class Down(Server):
        def config_get(self, pattern: str) -> dict[str, str]:
            raise redis.exceptions.ConnectionError("refused")

    guard = EvictionGuard()
    guard.read_sync(Down("allkeys-lru"))
    assert not guard.checked


def test_a_cluster_reply_per_node_is_read() -> None:
    assert policies({"10.0.0.1:7000": {"maxmemory-policy": "noeviction"},
                     "10.0.0.2:7000": {b"maxmemory-policy": b"allkeys-lru"}}) == [
        "noeviction", "allkeys-lru"]


def allkeys(fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """fakeredis has no CONFIG GET: answer it as an allkeys-lru server would."""
    monkeypatch.setattr(fake, "config_get", lambda pattern: {"maxmemory-policy": "allkeys-lru"},
                        raising=False)


def test_timers_warns_once_per_client(fake: fakeredis.FakeRedis,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    allkeys(fake, monkeypatch)
    for _ in range(2):  # each client warns once
        with Timers(fake) as t, pytest.warns(EvictionWarning) as caught:
            t.schedule("a.b", in_=60)
            t.schedule("a.b", in_=60)
            t.schedule_many([{"task": "a.b", "in_": 60}])
        assert len(caught) == 1
        assert caught[0].filename == __file__, "the warning points at the caller's line"


def test_strict_timers_refuses_every_write_and_writes_nothing(
        fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    allkeys(fake, monkeypatch)
    with Timers(fake, strict=True) as t:
        for _ in range(2):
            with pytest.raises(EvictionUnsafe, match="maxmemory-policy is allkeys-lru"):
                t.schedule("a.b", in_=60)
        with pytest.raises(EvictionUnsafe):
            t.every("tick", "a.b", interval=60)
        assert t.list() == []  # reads still work
    assert fake.dbsize() == 0


def test_async_timers_strict_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        client = fakeredis.FakeAsyncRedis()

        async def config_get(pattern: str) -> dict[str, str]:
            return {"maxmemory-policy": "allkeys-lfu"}

        monkeypatch.setattr(client, "config_get", config_get, raising=False)
        async with AsyncTimers(client, strict=True) as t:
            with pytest.raises(EvictionUnsafe, match="allkeys-lfu"):
                await t.schedule("a.b", in_=60)
        async with AsyncTimers(client) as t:
            with pytest.warns(EvictionWarning):
                await t.schedule("a.b", in_=60)
                await t.schedule("a.b", in_=60)
        await client.aclose()

    asyncio.run(scenario())
