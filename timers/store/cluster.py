"""Redis Cluster: ``redis+cluster://`` URLs, cluster clients, and where timers' keys live.

``redis+cluster://[user:password@]host:port[,host:port…]/`` (``rediss+cluster://`` for TLS)
names start nodes; redis-py finds the rest of the cluster and follows it (``MOVED``/``ASK``,
failovers). Every key a script touches must sit in one hash slot, so on a cluster the key
prefix is a hash tag: ``timers`` becomes ``{timers}`` (a prefix that has a ``{tag}``
already is kept), and every timer key and system key of that prefix lives on the primary
that owns the tag's slot. Its ``expired`` events are published there alone (they are
node-local), so a listener subscribes on that node, and again after any change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.cluster
import redis.exceptions

from timers.exceptions import ServerUnavailable
from timers.model.keys import Keyspace, configured_prefix
from timers.model.url_parts import credentials, host_ports, known_options

SCHEMES = ("redis+cluster", "rediss+cluster")
_SyncNode: Any = redis.cluster.ClusterNode  # parts of redis-py's cluster API have no types
_SyncCluster: Any = redis.cluster.RedisCluster
OPTIONS = ("socket_timeout", "socket_connect_timeout", "max_connections")


class _AsyncCluster(redis.asyncio.cluster.RedisCluster):
    """redis-py's asyncio cluster client, with one of its races read as what it is.

    When a node goes away, one command's failure closes the node's connections while
    another command of the same client is between taking a connection and writing to it;
    that command then fails inside redis-py with ``AttributeError``/``TypeError`` on a
    ``None`` stream. It is a lost connection, and is raised as one, so the listener's
    loops retry it as they retry any other (instead of the listener exiting).
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (AttributeError, TypeError) as exc:
            if "NoneType" not in str(exc):
                raise
            raise redis.exceptions.ConnectionError(
                f"connection closed under a command ({exc})") from exc


def set_connection_class(client: redis.asyncio.cluster.RedisCluster,
                         make: Callable[[type[Any]], type[Any]]) -> None:
    """Have every connection ``client`` opens from now on be of class ``make(its class)``:
    the nodes it knows, and those it finds later (made from its connection settings)."""
    kwargs = client.connection_kwargs
    kwargs["connection_class"] = make(kwargs.get("connection_class")
                                      or redis.asyncio.connection.Connection)
    for node in [*client.startup_nodes, *client.nodes_manager.startup_nodes.values(),
                 *client.nodes_manager.nodes_cache.values()]:
        node.connection_class = make(node.connection_class)


def is_cluster_url(url: object) -> bool:
    """Whether ``url`` is a ``redis+cluster://`` (or ``rediss+cluster://``) URL."""
    return isinstance(url, str) and url.split("://", 1)[0].lower() in SCHEMES


_CLUSTER_CLIENTS = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
_IS_CLUSTER: dict[type, bool] = {}


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a redis-py cluster client, sync or asyncio.

    Asked per script call and per event: the answer is kept per client class, as
    ``isinstance`` goes through the slow check of a ``Protocol`` these classes derive from.
    """
    kind = client.__class__
    known = _IS_CLUSTER.get(kind)
    if known is None:
        known = _IS_CLUSTER[kind] = isinstance(client, _CLUSTER_CLIENTS)
    return known


def hash_tagged(prefix: str) -> str:
    """``prefix`` as a hash tag (``{timers}``), unless it holds one (``app:{timers}``)."""
    start = prefix.find("{")
    if start != -1 and prefix.find("}", start + 2) != -1:
        return prefix
    return "{" + prefix + "}"


def keyspace_for(client: object, prefix: str | None) -> Keyspace:
    """The key layout for ``client``: the configured prefix, hash-tagged on a cluster."""
    chosen = configured_prefix(prefix)
    return Keyspace(hash_tagged(chosen) if is_cluster(client) else chosen)


def database_of(client: Any) -> int:
    """The database number a client uses (0 on a cluster, which has only that one)."""
    if is_cluster(client):
        return 0
    return int(client.connection_pool.connection_kwargs.get("db", 0) or 0)


def _settings(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ValueError(f"not a Redis Cluster URL (redis+cluster://…): {url!r}")
    nodes = host_ports(parts, url, "cluster node")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only; the URL names {parts.path!r}")
    query = known_options(parts, OPTIONS, "Redis Cluster")
    user, password = credentials(parts)
    kwargs: dict[str, Any] = {k: v for k, v in (("username", user), ("password", password))
                              if v is not None}
    if parts.scheme.lower() == "rediss+cluster":
        kwargs["ssl"] = True
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in query:
            kwargs[name] = float(query[name])
    if "max_connections" in query:
        kwargs["max_connections"] = int(query["max_connections"])
    return nodes, kwargs


def sync_cluster(url: str, **kwargs: Any) -> redis.cluster.RedisCluster:
    """A sync cluster client from ``url``; ``kwargs`` go to its connections."""
    nodes, settings = _settings(url)
    try:  # (a sync cluster client reads the cluster's layout as it is made)
        client: redis.cluster.RedisCluster = _SyncCluster(
            startup_nodes=[_SyncNode(h, p) for h, p in nodes], **{**kwargs, **settings})
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        where = ", ".join(f"{h}:{p}" for h, p in nodes)
        reason = str(exc).replace("Redis Cluster cannot be connected. ", "")
        raise ServerUnavailable(f"cannot reach the Redis Cluster at {where}: {reason}") from exc
    return client


def async_cluster(url: str, **kwargs: Any) -> redis.asyncio.cluster.RedisCluster:
    """An asyncio cluster client from ``url``."""
    nodes, settings = _settings(url)
    return _AsyncCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in nodes],
        **{**kwargs, **settings})


def sync_twin_of(client: Any, socket_timeout: float) -> redis.cluster.RedisCluster | None:
    """A sync client of the cluster asyncio ``client`` talks to, or None when it is not a
    cluster client; each call makes one attempt, each read or connect bounded by
    ``socket_timeout`` (the lease keeper's: a renewal fails fast and is tried again)."""
    if not isinstance(client, redis.asyncio.cluster.RedisCluster):
        return None
    nodes = [_SyncNode(n.host, n.port) for n in client.get_nodes()]
    kwargs = {k: v for k, v in client.get_connection_kwargs().items()
              if k in ("username", "password", "ssl")}
    # one attempt a call, each bounded by socket_timeout: with redis-py's default of 10
    # attempts one renewal call kept retrying CLUSTERDOWN while a primary failed over,
    # longer than the lease, then succeeded: nothing was logged while the leases lapsed
    twin: redis.cluster.RedisCluster = _SyncCluster(
        startup_nodes=nodes, socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout, cluster_error_retry_attempts=1, **kwargs)
    return twin


def node_clients(url: str) -> list[tuple[str, redis.Redis]]:
    """``("primary host:port", client)`` / ``("replica host:port", client)`` for every node
    of the cluster, each a direct sync client (``timers check`` reads each node)."""
    _, settings = _settings(url)
    settings.pop("max_connections", None)
    with sync_cluster(url) as client:
        listed = client.cluster_nodes()  # every node, the replicas too
    nodes = []
    for address, info in listed.items():
        host, _, port = str(address).rpartition(":")
        role = "primary" if "master" in str(info.get("flags", "")) else "replica"
        if "fail" not in str(info.get("flags", "")) and port.isdigit():
            nodes.append((role, host, int(port)))
    kwargs = {**settings, "decode_responses": True, "socket_timeout": 5.0,
              "socket_connect_timeout": 5.0}
    return [(f"{role} {host}:{port}", redis.Redis(host=host, port=port, **kwargs))
            for role, host, port in sorted(nodes, key=lambda n: (n[0] != "primary", n[2]))]
