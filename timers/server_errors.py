"""redis-py errors as the :class:`TimersError` a producer gets, in one line that says
what happened and to which server (never the password); the redis-py error is kept as
the ``__cause__``.
"""

from __future__ import annotations

import re
from typing import Any

import redis.exceptions
from redis.sentinel import MasterNotFoundError

from timers.exceptions import (
    PoolExhausted,
    ServerError,
    ServerOutOfMemory,
    ServerTimeout,
    ServerUnavailable,
    TimersError,
)

_REFUSED_CREDENTIALS = (redis.exceptions.AuthenticationError,
                        redis.exceptions.AuthorizationError)


_CONNECTING = re.compile(r"^Error \d+ connecting to \S+?\. ")
"""redis-py's prefix of a connect error, which repeats the address we already name."""


def server_address(client: Any) -> str:
    """``host:port`` (or the socket path) of a redis-py client, sync or asyncio."""
    if hasattr(client, "get_nodes") and hasattr(client, "nodes_manager"):  # a cluster
        return "the Redis Cluster (" + ", ".join(
            f"{n.host}:{n.port}" for n in client.get_nodes()[:3]) + ")"
    try:
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
    except AttributeError:
        return "the configured address"
    service = getattr(pool, "service_name", None)
    if service is not None:  # behind Sentinel: the address changes with each failover
        return f"the primary {service!r} (Sentinel)"
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _timeout(client: Any) -> str:
    try:
        seconds = client.connection_pool.connection_kwargs.get("socket_timeout")
    except AttributeError:
        seconds = None
    return f"within {seconds:g} s" if isinstance(seconds, int | float) else "in time"


def out_of_memory(exc: redis.exceptions.OutOfMemoryError) -> ServerOutOfMemory:
    error = ServerOutOfMemory(
        "Redis is out of memory (used memory > 'maxmemory') and refused the write: "
        "nothing was written; free memory or raise maxmemory"
    )
    error.__cause__ = exc
    return error


def translate(exc: redis.exceptions.RedisError, client: Any) -> TimersError:
    """The :class:`TimersError` to raise for ``exc``, met talking to ``client``."""
    where = server_address(client)
    error: TimersError
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return out_of_memory(exc)
    if isinstance(exc, redis.exceptions.TimeoutError):
        error = ServerTimeout(f"Redis at {where} did not answer {_timeout(client)}")
    elif _pool_ran_dry(exc):
        error = PoolExhausted(_pool_message(client, where))
    elif isinstance(exc, _REFUSED_CREDENTIALS):
        error = ServerUnavailable(f"Redis at {where} refused the credentials: {exc}")
    elif isinstance(exc, MasterNotFoundError):
        error = ServerUnavailable(f"cannot reach {where}: no sentinel named one that "
                                  f"answers (sentinels down or unreachable, or a failover "
                                  f"under way)")
    elif isinstance(exc, redis.exceptions.ConnectionError):
        reason = _CONNECTING.sub("", str(exc))
        error = ServerUnavailable(f"cannot connect to Redis at {where}: {reason}")
    else:
        error = ServerError(f"Redis at {where} answered with an error: {exc}")
    error.__cause__ = exc
    return error


def _pool_ran_dry(exc: redis.exceptions.RedisError) -> bool:
    """redis-py's words for a pool with no free connection (blocking pool: after its wait
    timeout; plain pool: at once)."""
    return (isinstance(exc, redis.exceptions.MaxConnectionsError)
            or str(exc) == "No connection available.")


def _pool_message(client: Any, where: str) -> str:
    pool = getattr(client, "connection_pool", None)
    size = getattr(pool, "max_connections", "?")
    wait = getattr(pool, "timeout", None)
    waited = f" within {wait:g} s" if isinstance(wait, int | float) else ""
    return (f"no free connection to Redis at {where}{waited}: all {size} of the client's "
            f"connections were in use. Allow more (max_connections=, or ?max_connections= "
            f"in the URL) or make fewer calls at once")
