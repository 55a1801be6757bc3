"""Making a producer's redis-py client from a URL: which URL, which timeouts, which pool.

A client made from a URL keeps at most ``max_connections`` connections (default 50, or
``?max_connections=`` in the URL); a call that finds them all in use waits up to
:data:`POOL_WAIT` seconds (``?timeout=``) for one instead of failing at once, then raises
:class:`~timers.exceptions.PoolExhausted`. (redis-py's own pool raises as soon as it is full.)
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import hiredis
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.retry
from redis.driver_info import DriverInfo

from timers import speed
from timers.exceptions import TimersError
from timers.model.url_parts import is_sentinel_url
from timers.store import cluster

DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "TIMERS_REDIS_URL"
URL_CLIENT_TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_timeout": 15.0}
"""Timeouts (s) of a client made from a URL, so a server that accepts and never answers
raises :class:`ServerTimeout` instead of hanging a producer; the URL's own
``?socket_timeout=`` … win."""
DEFAULT_MAX_CONNECTIONS = 50
POOL_WAIT = 20.0
"""Seconds a call waits for a free connection of a full pool (see the module docstring)."""


RECONNECTS = 1
"""A call whose connection the server had closed (a restart, Redis's ``timeout`` setting, a
proxy dropping idle sockets) runs once more, on a new connection, instead of failing. Only
for a lost connection: a timeout is not retried, so a paused server still raises
:class:`ServerTimeout` after one ``socket_timeout``. Repeating a call whose first try
did reach the server writes nothing twice (ids are made before sending; a schedule by id
replaces), though a repeated ``cancel`` then answers False."""


@dataclass(frozen=True)
class InMemoryServer:
    """Where every producer client goes while a :class:`timers.testing.TimersTest` (the
    ``timers_test`` fixture) is active: its in-memory server.

    While :data:`in_memory_server` is set, a client made from a URL (or from none) is a client
    of that server whatever the URL says, so an app that makes ``Timers()`` or
    ``AsyncTimers()`` itself (in a FastAPI lifespan, an app factory) is redirected; a
    client made before the test, or given a redis-py client of the app's own, is refused
    at its first call (:func:`refuse_outside_test_server`) rather than writing to a real
    Redis."""

    sync_client: Callable[[], redis.Redis]
    async_client: Callable[[], redis.asyncio.Redis]
    serves: Callable[[object], bool]
    """True for a redis-py client of the test's server."""


in_memory_server: InMemoryServer | None = None
"""The active test's server (set and reset by :class:`timers.testing.TimersTest`)."""


def refuse_outside_test_server(client: object, what: str) -> None:
    """Raise :class:`TimersError` when a test server is active and ``client`` (of the
    ``what`` that uses it) is not on it."""
    active = in_memory_server
    if active is not None and not active.serves(client):
        raise TimersError(
            f"{what} uses a Redis client that is not the timers test's in-memory server "
            f"(made before the test began, or given a redis-py client of the app's own): "
            f"inside timers_test / TimersTest it would write to a real Redis. Make it "
            f"inside the test from a URL or none (it then goes to the test's server), or "
            f"use timers_test.timers")


def configured_url(url: str | None = None) -> str:
    """``url`` if given, else ``$TIMERS_REDIS_URL``, else ``redis://localhost:6379/0``."""
    return url or os.environ.get(URL_ENV) or DEFAULT_URL


def _pool_settings(max_connections: int | None, retry: Any) -> dict[str, Any]:
    _check_max_connections(max_connections, "max_connections=")
    return {**URL_CLIENT_TIMEOUTS, "timeout": POOL_WAIT, "retry": retry,
            "max_connections": max_connections or DEFAULT_MAX_CONNECTIONS,
            # redis-py's version for CLIENT SETINFO, as redis-py would send it, without its
            # look-up of the installed distributions, a start-up cost of every process
            # (figures: bench/FINDINGS.md, "Start-up CPU")
            "driver_info": DriverInfo(lib_version=redis.__version__)}


def _reconnect(kind: Any) -> Any:
    """redis-py's ``Retry`` (sync or asyncio ``kind``) for :data:`RECONNECTS`."""
    return kind(redis.backoff.NoBackoff(), RECONNECTS,
                supported_errors=(redis.exceptions.ConnectionError,))


def _check_max_connections(value: object, where: str) -> None:
    """Refuse a pool size below 1 in one line (redis-py would take 0 as its default, 100)."""
    if value is None:
        return
    try:
        size = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        size = 0
    if isinstance(value, bool | float) or size < 1:
        raise ValueError(f"{where} must be a whole number of connections, 1 or more, got "
                         f"{value!r}")


def _checked_url(url: str | None) -> str:
    """``configured_url(url)``, its ``?max_connections=`` checked as the argument is."""
    url = configured_url(url)
    for value in parse_qs(urlsplit(url).query, keep_blank_values=True).get("max_connections", []):
        _check_max_connections(value, "?max_connections= in the Redis URL")
    return url


def _sentinel_settings(url: str, max_connections: int | None, retry: Any) -> dict[str, Any]:
    """A Sentinel-watched primary's pool settings (redis-py's Sentinel pool does not block
    when full: a call beyond ``max_connections`` fails at once)."""
    from timers.store import sentinel

    size = max_connections or sentinel.SentinelURL.parse(url).max_connections()
    _check_max_connections(size, "max_connections")
    return {**URL_CLIENT_TIMEOUTS, "retry": retry,
            "max_connections": size or DEFAULT_MAX_CONNECTIONS}


def sync_client(url: str | None, max_connections: int | None = None) -> redis.Redis:
    """A sync client over a blocking pool, for ``url`` (see :func:`configured_url`); a
    ``redis+sentinel://`` URL's follows its primary (:mod:`timers.store.sentinel`). Inside a
    timers test, a client of its in-memory server instead (see :class:`InMemoryServer`)."""
    if in_memory_server is not None:
        return in_memory_server.sync_client()
    url = configured_url(url)
    if cluster.is_cluster_url(url):
        return cluster.sync_cluster(url, **URL_CLIENT_TIMEOUTS)  # type: ignore[return-value]
    if is_sentinel_url(url):
        from timers.store import sentinel

        return sentinel.sync_primary(url, **_sentinel_settings(
            url, max_connections, _reconnect(redis.retry.Retry)))
    return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(
        _checked_url(url), **_pool_settings(max_connections, _reconnect(redis.retry.Retry))))


def async_client(url: str | None, max_connections: int | None = None) -> redis.asyncio.Redis:
    """An asyncio client over a blocking pool, for ``url`` (see :func:`configured_url`);
    inside a timers test, a client of its in-memory server (see :class:`InMemoryServer`)."""
    if in_memory_server is not None:
        return in_memory_server.async_client()
    url = configured_url(url)
    if cluster.is_cluster_url(url):
        return cluster.async_cluster(url, **URL_CLIENT_TIMEOUTS)  # type: ignore[return-value]
    if is_sentinel_url(url):
        from timers.store import sentinel

        return sentinel.async_primary(url, **_sentinel_settings(
            url, max_connections, _reconnect(redis.asyncio.retry.Retry)))
    return redis.asyncio.Redis.from_pool(redis.asyncio.BlockingConnectionPool.from_url(
        _checked_url(url),
        **_pool_settings(max_connections, _reconnect(redis.asyncio.retry.Retry))))


SCRIPT_CONNECTION_MIN_POOL = 2
"""A pool smaller than this has no :class:`ScriptConnection` (it would keep the only connection)."""


class ScriptConnection:
    """One connection of a sync client's pool kept aside for script calls: a call that
    finds it free sends its command on it straight away, without redis-py's pool
    checkout and command wrapper, which cost a single ``schedule()`` more client CPU than
    all of timers' own work (the pool's queue and readiness check, and its metrics hooks,
    called even when no metrics are kept). A call that finds it busy (another
    thread's call is on it) goes through the client as before, so calls in parallel still
    share the rest of the pool (figures: bench/FINDINGS.md, "The producer's script connections").

    The same rules as the client's own: a lost connection (:class:`ConnectionError`) is
    made again and the command sent once more (:data:`RECONNECTS`); an error reply is
    raised as it is; any other failure (a timeout, an interrupt) drops the connection,
    whose reply may still be on its way. A forked child takes its own connection. The
    connection counts against ``max_connections``; closing the client closes it too (a
    later call connects again).
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client: Any = client
        self.pool: Any = client.connection_pool
        self._lock = threading.Lock()
        self._connection: Any = None
        _KEPT.add(self)

    def _forked(self) -> None:
        """In a forked child: drop the parent's connection (the child's first call takes
        its own from the pool) and its lock (another thread may have held it at the
        fork)."""
        self._connection = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: object) -> ScriptConnection | None:
        """One for a client :func:`sync_client` made for a plain ``redis://`` URL (not
        a test server, cluster or Sentinel), or None (and with the speed trick
        ``connections`` off)."""
        if (type(client) is not redis.Redis or client.connection is not None
                or not speed.on("connections")):
            return None
        pool = client.connection_pool
        if (type(pool) is not redis.BlockingConnectionPool
                or pool.max_connections < SCRIPT_CONNECTION_MIN_POOL):
            return None
        return cls(client)

    def execute_command(self, *args: Any) -> Any:
        """``client.execute_command(*args)``, on the script connection when it is free."""
        if not self._lock.acquire(blocking=False):
            return self.client.execute_command(*args)
        try:
            connection = self._connection
            if connection is None:  # (a forked child's is dropped at the fork: _forked)
                connection = self._connection = self.pool.get_connection()
            packed = [hiredis.pack_command(args)]
            for attempt in range(RECONNECTS + 1):
                try:
                    connection.send_packed_command(packed)
                    return connection.read_response()
                except redis.exceptions.ResponseError:
                    raise  # the whole reply was read: the connection stays
                except redis.exceptions.ConnectionError:
                    connection.disconnect()
                    if attempt == RECONNECTS:
                        raise
                except BaseException:
                    connection.disconnect()
                    raise
            raise AssertionError("unreachable")
        finally:
            self._lock.release()


_KEPT: weakref.WeakSet[ScriptConnection] = weakref.WeakSet()
"""Every live :class:`ScriptConnection`: a forked child drops their connections at the
fork, so no call asks the process id (a system call) to find out."""


def _drop_kept_after_fork() -> None:
    for kept in list(_KEPT):
        kept._forked()


os.register_at_fork(after_in_child=_drop_kept_after_fork)


class AsyncScriptConnection:
    """The script calls of an asyncio client made from a plain ``redis://`` URL, packed
    by hiredis: redis-py's asyncio connection packs each command in Python, argument by
    argument, which for a large coalesced call was a good share of ``AsyncTimers``' CPU.
    As :class:`ScriptConnection`, it keeps one connection of the pool aside (a pool of
    :data:`SCRIPT_CONNECTION_MIN_POOL` or more): a call that finds it free sends on it straight
    away, without the pool's checkout (its condition, timeout and readiness check, a good
    share of a lone awaited ``schedule``'s client CPU); a call that finds it busy takes a
    connection from the pool and gives it back, as ``execute_command`` does. The same
    rules as :class:`ScriptConnection`'s otherwise
    (figures: bench/FINDINGS.md, "The producer's script connections")."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.pool: Any = client.connection_pool
        self._connection: Any = None
        self._busy = self.pool.max_connections < SCRIPT_CONNECTION_MIN_POOL
        """Whether the kept connection is in use (always, in a pool too small to keep
        one)."""

    @classmethod
    def of(cls, client: object) -> AsyncScriptConnection | None:
        """One for a client :func:`async_client` made for a plain URL, or None (and with
        the speed trick ``connections`` off)."""
        if (type(client) is not redis.asyncio.Redis or client.single_connection_client
                or not speed.on("connections")
                or type(client.connection_pool) is not redis.asyncio.BlockingConnectionPool):
            return None
        return cls(client)

    async def execute_command(self, *args: Any) -> Any:
        """``await client.execute_command(*args)``, its command packed by hiredis, on the
        kept connection when it is free."""
        packed = [hiredis.pack_command(args)]
        kept = not self._busy
        if kept:
            self._busy = True
            connection = self._connection
            if connection is None:
                try:
                    connection = self._connection = await self.pool.get_connection()
                except BaseException:
                    self._busy = False
                    raise
        else:
            connection = await self.pool.get_connection()
        try:
            for attempt in range(RECONNECTS + 1):
                try:
                    await connection.send_packed_command(packed)
                    return await connection.read_response()
                except redis.exceptions.ResponseError:
                    raise  # the whole reply was read: the connection stays
                except redis.exceptions.ConnectionError:
                    await connection.disconnect()
                    if attempt == RECONNECTS:
                        raise
                except BaseException:
                    await connection.disconnect(nowait=True)
                    raise
            raise AssertionError("unreachable")
        finally:
            if kept:
                self._busy = False
            else:
                await self.pool.release(connection)
