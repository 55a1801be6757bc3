"""redis-py errors as the :class:`TimersError` a producer gets, in one line that says
what happened and to which server (never the password); the redis-py error is kept as
the ``__cause__``.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any
from urllib.parse import urlsplit

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
from timers.model.redact import safe_url

_REFUSED_CREDENTIALS = (redis.exceptions.AuthenticationError,
                        redis.exceptions.AuthorizationError)


_CONNECTING = re.compile(r"^Error -?\d+ connecting to \S+?\. ")
"""redis-py's prefix of a connect error, which repeats the address we already name."""


def connect_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few plain words ("connection refused", "name or
    service not known", "timed out"), whatever redis-py (sync or asyncio) wrapped."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, socket.gaierror) and cause.strerror:
            return _plain(cause.strerror)
        if isinstance(cause, TimeoutError | socket.timeout):
            return "timed out"
        if isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0:
            return _plain(os.strerror(cause.errno))
    text = str(exc)
    number = re.match(r"^Error (\d+) connecting", text) or re.search(r"\[Errno (\d+)\]", text)
    if number:
        return _plain(os.strerror(int(number.group(1))))
    if isinstance(exc, redis.exceptions.TimeoutError) or text.lower().startswith("timeout"):
        return "timed out"
    return _plain(_CONNECTING.sub("", text)) or "no answer"


def _plain(reason: str) -> str:
    reason = reason.strip().rstrip(".")
    return reason[:1].lower() + reason[1:] if reason[1:2].islower() else reason


def cannot_connect(where: str, exc: BaseException) -> str:
    """The one wording of a failed connection, for every command and the listener:
    ``cannot connect to Redis at localhost:6379: connection refused``."""
    return f"cannot connect to Redis at {where}: {connect_reason(exc)}"


def url_address(url: str) -> str:
    """``host:port`` (or the socket path) a ``redis://``, ``rediss://`` or ``unix://`` URL
    names, as :func:`server_address` names a client's; other URLs (Sentinel, a cluster's
    list of nodes) as they are, without a password."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return parts.path
        if parts.scheme in ("redis", "rediss") and "," not in parts.netloc:
            return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
    except ValueError:
        pass
    return safe_url(url)


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
        error = ServerUnavailable(cannot_connect(where, exc))
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
