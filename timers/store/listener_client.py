"""The listener's Redis client: options that fit the connection class of its URL.

``unix://`` URLs make redis-py use a Unix socket connection, which takes no TCP options
(``socket_keepalive``, ``socket_connect_timeout`` …): passing them raised a TypeError on
the first command.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.asyncio.connection import UnixDomainSocketConnection, parse_url

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
        return cluster.async_cluster(url, **options, socket_keepalive=True)  # type: ignore[return-value]
    if sentinel.is_sentinel_url(url):
        return sentinel.async_primary(url, **options, socket_keepalive=True)
    if not _is_unix(url):
        options["socket_keepalive"] = True
    return redis.asyncio.Redis.from_url(url, **options)


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
