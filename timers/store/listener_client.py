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
``ConnectionError``, which the listener's loops retry. A write that finds the connection's
stream already set to ``None`` (the same race a moment later: a cluster pub/sub
resubscribing while its node failed over) fails in redis-py with ``AttributeError``: it
stopped a listener of the chaos checker's Cluster run, its events loop dead.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import hiredis
import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import AbstractConnection, UnixDomainSocketConnection, parse_url

from timers import speed
from timers.model.url_parts import is_sentinel_url
from timers.store import cluster, sentinel
from timers.store.connect import RECONNECTS, configured_url

TCP_ONLY = ("socket_keepalive", "socket_keepalive_options", "socket_type")
PACK_IN_C = speed.on("packing")
"""Whether the listener's connections pack commands with hiredis (the speed trick
``packing``); without it, redis-py packs them."""


def listener_client(url: str) -> redis.asyncio.Redis:
    """A bytes client for ``url`` with health checks, timeouts and RESP2 (see the listener),
    TCP keepalive only where the connection is TCP."""
    options: dict[str, Any] = {
        "health_check_interval": 30,
        "socket_connect_timeout": 5,
        "socket_timeout": 15,
        # RESP2: redis-py reads each pub/sub message as a plain reply, not through its
        # RESP3 push handler, so a burst of due timers fires faster
        # (figures: bench/FINDINGS.md, "The listener's pub/sub over RESP2")
        "protocol": 2,
    }
    if cluster.is_cluster_url(url):
        client = cluster.async_cluster(url, **options, socket_keepalive=True)
        cluster.set_connection_class(client, listener_connection)
        return client  # type: ignore[return-value]
    if is_sentinel_url(url):
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
        except (AttributeError, TypeError) as exc:  # its stream set to None meanwhile
            if "NoneType" not in str(exc):
                raise
            raise redis.exceptions.ConnectionError(
                f"connection closed under a command ({exc})") from exc

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if PACK_IN_C and ((isinstance(first, str) and " " not in first) or (
                isinstance(first, bytes) and b" " not in first)):
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


class ReservedConnection:
    """One connection of the listener's client kept aside for one of its hot script calls
    (a claim, a batch of endings), which are sent one at a time each: the call goes out on
    it straight away, without redis-py's asyncio command path. That path cost a command
    here far more CPU than the same send and read on a connection: the pool's lock,
    readiness check and metrics hooks, a retry wrapper, and an asyncio task made by
    ``asyncio.wait_for`` for each send that has a ``socket_timeout``
    (figures: bench/FINDINGS.md, "The listener's reserved connections").

    The rules are the client's own: the whole call (connect, send, reply) has the client's
    ``socket_timeout`` and a call past it raises redis-py's ``TimeoutError`` and drops the
    connection; a lost connection (``ConnectionError``) is made again and the command sent
    once more (:data:`~timers.store.connect.RECONNECTS`, as the client's retry does); an
    error reply is raised as it is and keeps the connection (the whole reply was read); any
    other failure, a cancellation too, drops the connection, whose reply may still be on
    its way. A call that finds it busy goes through the client. A forked child makes its
    own. :meth:`aclose` closes it (the listener does, before it closes its client)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client: Any = client
        pool: Any = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        self.timeout: float | None = kwargs.get("socket_timeout")
        kwargs["socket_timeout"] = None  # the call's one deadline instead (above)
        self._make: Any = lambda: pool.connection_class(**kwargs)
        self._connection: Any = None
        self._pid = 0
        self._busy = False

    @classmethod
    def of(cls, client: object) -> ReservedConnection | None:
        """One for a client :func:`listener_client` made for a plain ``redis://`` or
        ``unix://`` URL (not a cluster, Sentinel or a client given by the app), else None
        (and with the speed trick ``connections`` off)."""
        if (type(client) is not redis.asyncio.Redis or client.single_connection_client
                or not speed.on("connections")):
            return None
        pool = client.connection_pool
        if type(pool) is not redis.asyncio.ConnectionPool or not issubclass(
                pool.connection_class, _ListenerConnection):
            return None
        return cls(client)

    async def execute_command(self, *args: Any) -> Any:
        """``await client.execute_command(*args)``, on the reserved connection when free."""
        if self._busy:
            return await self.client.execute_command(*args)
        self._busy = True
        try:
            packed = [hiredis.pack_command(args)]
            for attempt in range(RECONNECTS + 1):
                connection = self._connection
                if connection is None or self._pid != os.getpid():
                    connection, self._pid = self._make(), os.getpid()
                    self._connection = connection
                try:
                    async with asyncio.timeout(self.timeout):
                        await connection.send_packed_command(packed, check_health=False)
                        return await connection.read_response()
                except redis.exceptions.ResponseError:
                    raise  # the whole reply was read: the connection stays
                except redis.exceptions.ConnectionError:
                    await connection.disconnect(nowait=True)
                    if attempt == RECONNECTS:
                        raise
                except TimeoutError:
                    await connection.disconnect(nowait=True)
                    raise redis.exceptions.TimeoutError(
                        f"no reply within {self.timeout} s") from None
                except BaseException:
                    await connection.disconnect(nowait=True)
                    raise
            raise AssertionError("unreachable")
        finally:
            self._busy = False

    async def aclose(self) -> None:
        """Close the connection (a later call makes a new one)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.disconnect(nowait=True)


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
