"""A producer reads the server's eviction policy once, on its first write (with the
prefix's data format, in one round trip): under ``allkeys-*`` it warns once per client,
or, strict, refuses every write (nothing written)."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import fakeredis
import pytest
import redis

from timers import AsyncTimers, EvictionUnsafe, EvictionWarning, Timers, UnknownFormat
from timers.store import first_write
from timers.store.eviction import EvictionGuard, policies
from timers.store.first_write import FirstWriteCheck

KEY = "timers|format"


class Server:
    """A stand-in client: CONFIG GET (or, refused, INFO memory) answers ``policy``, GET of
    the format key ``stored``; ``round_trips`` counts what it was sent."""

    def __init__(self, policy: str, config: bool = True, info: bool = True,
                 stored: str | None = None) -> None:
        self.policy, self.config, self.info_allowed = policy, config, info
        self.stored = stored
        self.round_trips = 0

    def config_get(self, pattern: str) -> dict[str, str]:
        if not self.config:
            raise redis.exceptions.NoPermissionError("NOPERM config")
        return {"maxmemory-policy": self.policy}

    def info(self, section: str) -> dict[str, Any]:
        self.round_trips += 1
        if not self.info_allowed:
            raise redis.exceptions.ResponseError("unknown command 'INFO'")
        return {"maxmemory_policy": self.policy, "used_memory": 1}

    def get(self, key: str) -> str | None:
        return self.stored if key == KEY else None

    def pipeline(self, transaction: bool = True) -> Pipe:
        return Pipe(self)


class Pipe:
    """The stand-in's pipeline: queued reads, sent in one round trip."""

    def __init__(self, server: Server) -> None:
        self.server, self.queued = server, []  # type: ignore[var-annotated]

    def config_get(self, pattern: str) -> None:
        self.queued.append(lambda: self.server.config_get(pattern))

    def get(self, key: str) -> None:
        self.queued.append(lambda: self.server.get(key))

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        self.server.round_trips += 1
        replies: list[Any] = []
        for read in self.queued:
            try:
                replies.append(read())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies


def test_allkeys_warns_once_naming_the_policy_and_why() -> None:
    check, server = FirstWriteCheck(KEY), Server("allkeys-lru")
    with pytest.warns(EvictionWarning) as caught:
        for _ in range(3):
            check.read_sync(server)
            check.refuse()
    assert len(caught) == 1
    assert server.round_trips == 1, "the policy and the format: one round trip, once"
    message = str(caught[0].message)
    assert "allkeys-lru" in message and "every pending timer lost" in message
    assert "noeviction" in message


@pytest.mark.parametrize("server", [Server("noeviction"), Server("volatile-lru"),
                                    Server("allkeys-lru", config=False, info=False)])
def test_a_safe_or_unknown_policy_says_nothing(server: Server) -> None:
    check = FirstWriteCheck(KEY, EvictionGuard(strict=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check.read_sync(server)
        check.refuse()
    assert check.checked and check.clear and check.eviction.policy is None


def test_info_is_read_where_config_is_refused() -> None:
    check, server = FirstWriteCheck(KEY, EvictionGuard(strict=True)), Server(
        "allkeys-random", config=False)
    check.read_sync(server)
    assert server.round_trips == 2, "INFO follows the refused CONFIG GET"
    with pytest.raises(EvictionUnsafe, match=r"allkeys-random.*nothing was written"):
        check.refuse()


def test_a_newer_format_is_refused_before_the_eviction_policy_is_said() -> None:
    check = FirstWriteCheck(KEY, EvictionGuard(strict=True))
    check.read_sync(Server("allkeys-lru", stored="9"))
    for _ in range(2):
        with pytest.raises(UnknownFormat, match="holds data format 9"):
            check.refuse()


def test_a_cluster_reads_each_with_a_command_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster pipeline carries no CONFIG: the policy and the format are two commands."""
    class Cluster(Server):
        def pipeline(self, transaction: bool = True) -> Pipe:
            raise AssertionError("a cluster pipeline refuses CONFIG GET")

    monkeypatch.setattr(first_write, "is_cluster", lambda client: isinstance(client, Cluster))
    check = FirstWriteCheck(KEY)
    check.read_sync(Cluster("noeviction", stored="9"))
    with pytest.raises(UnknownFormat):
        check.refuse()


def test_a_server_that_cannot_be_reached_is_checked_on_the_next_write() -> None:
    class Down(Server):
        def pipeline(self, transaction: bool = True) -> Pipe:
            raise redis.exceptions.ConnectionError("refused")

    check = FirstWriteCheck(KEY)
    check.read_sync(Down("allkeys-lru"))
    assert not check.checked and not check.clear


def test_a_cluster_reply_per_node_is_read() -> None:
    assert policies({"10.0.0.1:7000": {"maxmemory-policy": "noeviction"},
                     "10.0.0.2:7000": {b"maxmemory-policy": b"allkeys-lru"}}) == [
        "noeviction", "allkeys-lru"]


def allkeys(fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """fakeredis has neither CONFIG GET nor INFO: answer INFO (read where CONFIG GET is
    refused) as an allkeys-lru server would."""
    monkeypatch.setattr(fake, "info", lambda section: {"maxmemory_policy": "allkeys-lru"},
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

        async def info(section: str) -> dict[str, str]:
            return {"maxmemory_policy": "allkeys-lfu"}

        monkeypatch.setattr(client, "info", info, raising=False)
        async with AsyncTimers(client, strict=True) as t:
            with pytest.raises(EvictionUnsafe, match="allkeys-lfu"):
                await t.schedule("a.b", in_=60)
        async with AsyncTimers(client) as t:
            with pytest.warns(EvictionWarning):
                await t.schedule("a.b", in_=60)
                await t.schedule("a.b", in_=60)
        await client.aclose()

    asyncio.run(scenario())
