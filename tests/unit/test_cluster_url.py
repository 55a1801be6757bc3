"""``redis+cluster://`` URLs and the hash-tagged key prefix a cluster needs."""

from __future__ import annotations

import pytest

from timers import Timers
from timers.store.cluster import hash_tagged, is_cluster_url


def test_on_a_cluster_the_prefix_becomes_a_hash_tag_unless_it_has_one() -> None:
    assert hash_tagged("timers") == "{timers}"
    assert hash_tagged("app{timers}") == "app{timers}"
    assert hash_tagged("odd{}") == "{odd{}}"  # an empty tag is no tag
    assert is_cluster_url("redis+cluster://h:7000/") and not is_cluster_url("redis://h/0")


@pytest.mark.parametrize(("url", "says"), [
    ("redis+cluster://", "names no cluster node (host:port)"),
    ("redis+cluster://h:7000,h/", "bad cluster node address 'h'"),
    ("redis+cluster://h:7000/3", "database 0 only"),
    ("redis+cluster://h:7000/?timeout=1", "unknown option 'timeout'"),
])
def test_a_bad_cluster_url_is_refused_in_one_line_naming_the_problem(url: str,
                                                                     says: str) -> None:
    with pytest.raises(ValueError) as caught:
        Timers(url)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_command_whose_connection_closed_under_it_fails_as_a_lost_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py's asyncio cluster client can fail a command with ``AttributeError`` when a
    node's connections are closed under it (seen with a primary killed mid-run): the
    listener's loops retry connection errors, and exited on this one."""
    import asyncio

    import redis.asyncio.cluster
    import redis.exceptions

    from timers.store.cluster import async_cluster

    async def closed_under_it(self: object, *args: object, **kwargs: object) -> object:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    async def own_bug(self: object, *args: object, **kwargs: object) -> object:
        raise AttributeError("'Thing' object has no attribute 'x'")

    client = async_cluster("redis+cluster://127.0.0.1:1")
    monkeypatch.setattr(redis.asyncio.cluster.RedisCluster, "execute_command", closed_under_it)
    with pytest.raises(redis.exceptions.ConnectionError, match="closed under a command"):
        asyncio.run(client.execute_command("PING"))
    monkeypatch.setattr(redis.asyncio.cluster.RedisCluster, "execute_command", own_bug)
    with pytest.raises(AttributeError):
        asyncio.run(client.execute_command("PING"))


def test_a_write_that_finds_its_stream_gone_is_a_lost_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race one step later, in any of the listener's connections (a cluster
    pub/sub resubscribing while its node fails over): the write finds the connection's
    stream set to None. A lost connection, which the events loop retries; it stopped the
    listener (its events loop dead) in the chaos checker's Cluster run."""
    import asyncio

    import redis.asyncio.connection
    import redis.exceptions

    from timers.store.listener_client import listener_connection

    async def stream_gone(self: object, command: object) -> None:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    async def own_bug(self: object, command: object) -> None:
        raise AttributeError("'Thing' object has no attribute 'x'")

    async def disconnect(self: object, nowait: bool = False) -> None:
        pass

    kind = listener_connection(redis.asyncio.connection.Connection)
    monkeypatch.setattr(kind, "is_connected", property(lambda self: True))
    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "disconnect", disconnect)
    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "_send_packed_command",
                        stream_gone)
    with pytest.raises(redis.exceptions.ConnectionError, match="closed under a command"):
        asyncio.run(kind().send_packed_command([b"PING"], check_health=False))
    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "_send_packed_command",
                        own_bug)
    with pytest.raises(AttributeError):
        asyncio.run(kind().send_packed_command([b"PING"], check_health=False))
