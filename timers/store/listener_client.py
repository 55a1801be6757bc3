"""The listener's Redis client: options that fit the connection class of its URL.

``unix://`` URLs make redis-py use a Unix socket connection, which takes no TCP options
(``socket_keepalive``, ``socket_connect_timeout`` …): passing them raised a TypeError on
the first command.

Its connections pack commands with hiredis (in C) rather than redis-py's asyncio packer
(in Python, per argument): a finish call carries some 130 arguments (a batch of endings),
and packing it in Python cost the listener more than running the script cost Redis.

They also raise a write to a connection closed under it as the ``ConnectionError`` it is.
On uvloop's loop such a write (a cluster client closing a node's connections after one
command failed, while another command of the same client was about to write; a slot
moving to another primary does it) raises ``RuntimeError`` ("the handler is closed"),
which redis-py passes on; asyncio's loop lets the write go and redis-py raises
``ConnectionError``, which the listener's loops retry.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import AbstractConnection, UnixDomainSocketConnection, parse_url

from timers.store import cluster, sentinel
from timers.store.connect import configured_url

TCP_ONLY = ("socket_keepalive", "socket_keepalive_options", "socket_type")


def listener_client(url: str) -> redis.asyncio.Redis:
    """A bytes client for ``url`` with health checks, timeouts and RESP2 (see the listener),
    TCP keepalive only where the connection is TCP."""
    options: dict[str, Any] = {
        "health_check_interval": 30,
        "socket_connect_timeout": 5,
        "socket_timeout": 15,
        # RESP2: redis-py reads each pub/sub message as a plain reply, not through its
        # RESP3 push handler (20k due at once: 8.4-10.5k -> 10.7k fires/s)
        "protocol": 2,
    }
    if cluster.is_cluster_url(url):
        client = cluster.async_cluster(url, **options, socket_keepalive=True)
        cluster.set_connection_class(client, listener_connection)
        return client  # type: ignore[return-value]
    if sentinel.is_sentinel_url(url):
        return packing_in_c(sentinel.async_primary(url, **options, socket_keepalive=True))
    if not _is_unix(url):
        options["socket_keepalive"] = True
    return packing_in_c(redis.asyncio.Redis.from_url(url, **options))


class _ListenerConnection:
    """Mixed into a redis-py asyncio connection class: :meth:`pack_command` by hiredis.
    A command whose name holds a space (``"FUNCTION LOAD"``: redis-py splits it) or an
    argument hiredis does not take (redis-py refuses it with its own error) goes the
    usual way. A write to a transport closed under it is a ``ConnectionError``
    (:meth:`send_packed_command`)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """redis-py's, with uvloop's ``RuntimeError`` on a closed transport raised as the
        lost connection it is (redis-py has disconnected the connection by then)."""
        try:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except RuntimeError as exc:
            if "closed" not in str(exc):
                raise
            raise redis.exceptions.ConnectionError(
                f"connection closed under a command ({exc})") from exc

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if (isinstance(first, str) and " " not in first) or (
                isinstance(first, bytes) and b" " not in first):
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return super().pack_command(*args)  # type: ignore[misc, no-any-return]


_PACKED: dict[str, type[AbstractConnection]] = {}


def listener_connection(kind: type[AbstractConnection]) -> type[AbstractConnection]:
    """``kind`` as the listener's connections are (:class:`_ListenerConnection`), made once
    per class; same name (``sync_twin`` finds the sync class of that name)."""
    if issubclass(kind, _ListenerConnection):
        return kind
    key = f"{kind.__module__}.{kind.__qualname__}"
    if key not in _PACKED:
        _PACKED[key] = type(kind.__name__, (_ListenerConnection, kind), {"__module__": __name__})
    return _PACKED[key]


def packing_in_c(client: redis.asyncio.Redis) -> redis.asyncio.Redis:
    """``client``, whose connections (those its pool makes from now on) are the listener's:
    packing commands with hiredis, a write on a closed transport a ``ConnectionError``."""
    pool = client.connection_pool
    pool.connection_class = listener_connection(pool.connection_class)
    return client


def _is_unix(url: str) -> bool:
    try:
        return parse_url(url).get("connection_class") is UnixDomainSocketConnection
    except ValueError:
        return url.startswith("unix://")


def client_of(redis_: str | redis.asyncio.Redis | None) -> tuple[redis.asyncio.Redis, bool]:
    """The listener's client (a URL's, or the one given) and whether it owns it (closes
    it at the end)."""
    if isinstance(redis_, redis.asyncio.Redis | redis.asyncio.RedisCluster):
        if _decodes(redis_):
            raise ValueError("the listener needs a client with decode_responses=False")
        return redis_, False
    return listener_client(configured_url(redis_)), True


def _decodes(client: redis.asyncio.Redis | redis.asyncio.RedisCluster) -> bool:
    if isinstance(client, redis.asyncio.RedisCluster):
        return bool(client.get_connection_kwargs().get("decode_responses"))
    return bool(client.connection_pool.connection_kwargs.get("decode_responses"))


def check_limits(concurrency: int, lease: float) -> None:
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if lease < 0.1:
        raise ValueError("lease must be at least 0.1 seconds")
