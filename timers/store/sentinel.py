"""Redis Sentinel URLs: which sentinels, which primary, and clients that follow failovers.

``redis+sentinel://[user:password@]host:port[,host:port…]/<service>[/<db>][?options]``
(``rediss+sentinel://`` for TLS to the sentinels and the data nodes). The user and
password are the data nodes'; the sentinels' own are ``?sentinel_username=`` and
``?sentinel_password=``. Other options: ``socket_timeout``, ``socket_connect_timeout``
(seconds) and ``max_connections``.

A client made here asks the sentinels for the primary of ``<service>`` whenever it opens a
connection. After a failover its connections to the old primary fail (or answer
``READONLY``, which redis-py turns into a connection error): the next connection goes to
the new primary, so a producer's call that met the failover runs once more there
(:data:`timers.store.connect.RECONNECTS`), and a listener resubscribes and sweeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.retry
import redis.sentinel

from timers.model.url_parts import SENTINEL_SCHEMES, credentials, host_ports, known_options

DEFAULT_SENTINEL_PORT = 26379
OPTIONS = ("sentinel_username", "sentinel_password", "socket_timeout",
           "socket_connect_timeout", "max_connections")
_SyncSentinel: Any = redis.sentinel.Sentinel  # redis-py's sentinel module has no types
_AsyncSentinel: Any = redis.asyncio.sentinel.Sentinel
SENTINEL_TIMEOUT = 2.0
"""Seconds a sentinel has to answer "who is the primary" before the next one is asked."""


@dataclass(frozen=True)
class SentinelURL:
    """What a Sentinel URL says (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """Read ``url``; a :class:`ValueError` of one line names what is wrong."""
        parts = urlsplit(url)
        if parts.scheme.lower() not in SENTINEL_SCHEMES:
            raise ValueError(f"not a Sentinel URL (redis+sentinel://…): {url!r}")
        sentinels = tuple(host_ports(parts, url, "sentinel", DEFAULT_SENTINEL_PORT))
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ValueError("a Sentinel URL's path is /<service name>[/<db>], e.g. "
                             f"redis+sentinel://localhost:26379/mymaster/0, got {url!r}")
        if len(path) == 2 and not path[1].isdigit():
            raise ValueError(f"the database in a Sentinel URL must be a number, got {path[1]!r}")
        query = known_options(parts, OPTIONS, "Sentinel")
        user, password = credentials(parts)
        return cls(sentinels, unquote(path[0]), int(path[1]) if len(path) == 2 else 0,
                   user, password, parts.scheme.lower() == "rediss+sentinel", query)

    def connection_kwargs(self) -> dict[str, Any]:
        """redis-py connection settings of the data nodes (the primary)."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username:
            kwargs["username"] = self.username
        if self.password:
            kwargs["password"] = self.password
        if self.tls:
            kwargs["ssl"] = True
        for name in ("socket_timeout", "socket_connect_timeout"):
            if name in self.options:
                kwargs[name] = _seconds(self.options[name], name)
        return kwargs

    def sentinel_kwargs(self, asyncio: bool = False) -> dict[str, Any]:
        """redis-py connection settings of the sentinels themselves."""
        kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT,
                                  "socket_connect_timeout": SENTINEL_TIMEOUT,
                                  # the next sentinel is asked at once: no backoff
                                  "retry": _no_retry(asyncio)}
        if self.options.get("sentinel_username"):
            kwargs["username"] = self.options["sentinel_username"]
        if self.options.get("sentinel_password"):
            kwargs["password"] = self.options["sentinel_password"]
        if self.tls:
            kwargs["ssl"] = True
        return kwargs

    def max_connections(self) -> int | None:
        value = self.options.get("max_connections")
        return None if value is None else int(value) if value.isdigit() else 0


def _no_retry(asyncio: bool) -> Any:
    kind = redis.asyncio.retry.Retry if asyncio else redis.retry.Retry
    return kind(redis.backoff.NoBackoff(), 0)


def _seconds(value: str, name: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"?{name}= in the Sentinel URL must be a number of seconds, "
                         f"got {value!r}")
    return seconds


def sync_primary(url: str, **kwargs: Any) -> redis.Redis:
    """A sync client of the primary that ``url`` names; ``kwargs`` go to its connections."""
    target = SentinelURL.parse(url)
    manager = _SyncSentinel(list(target.sentinels),
                                      sentinel_kwargs=target.sentinel_kwargs())
    client: redis.Redis = manager.master_for(
        target.service, **{**target.connection_kwargs(), **kwargs})
    return client


def async_primary(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """An asyncio client of the primary that ``url`` names."""
    target = SentinelURL.parse(url)
    manager = _AsyncSentinel(list(target.sentinels),
                                              sentinel_kwargs=target.sentinel_kwargs(asyncio=True))
    client: redis.asyncio.Redis = manager.master_for(
        target.service, **{**target.connection_kwargs(), **kwargs})
    return client


def sync_twin_of(client: Any, socket_timeout: float) -> redis.Redis | None:
    """A sync client of the same Sentinel-watched primary as asyncio ``client``, or None
    when ``client`` is not one."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        return None
    manager = pool.sentinel_manager
    addresses = [(s.connection_pool.connection_kwargs.get("host", "localhost"),
                  s.connection_pool.connection_kwargs.get("port", DEFAULT_SENTINEL_PORT))
                 for s in manager.sentinels]
    kwargs = {k: v for k, v in pool.connection_kwargs.items()
              if k in ("db", "username", "password", "ssl", "socket_connect_timeout")}
    sync_manager = _SyncSentinel(addresses, sentinel_kwargs={
        **manager.sentinel_kwargs, "retry": _no_retry(asyncio=False)})
    twin: redis.Redis = sync_manager.master_for(pool.service_name,
                                                socket_timeout=socket_timeout, **kwargs)
    return twin


def node_clients(url: str) -> list[tuple[str, redis.Redis]]:
    """``("primary host:port", client)`` and one ``("replica host:port", client)`` per
    replica the sentinels know, each a direct sync client (``timers check`` reads every
    node's settings: a replica is promoted with its own)."""
    target = SentinelURL.parse(url)
    manager = _SyncSentinel(list(target.sentinels),
                                      sentinel_kwargs=target.sentinel_kwargs())
    nodes = [("primary", manager.discover_master(target.service))]
    nodes += [("replica", address) for address in manager.discover_slaves(target.service)]
    kwargs = {**target.connection_kwargs(), "decode_responses": True,
              "socket_timeout": 5.0, "socket_connect_timeout": 5.0}
    return [(f"{role} {host}:{port}", redis.Redis(host=host, port=port, **kwargs))
            for role, (host, port) in nodes]
