"""Carrying one :class:`~timers.ops.base.Request` (a round trip) over a redis-py client,
sync or asyncio: a lone script call as EVALSHA, anything else as one pipeline (a
transaction when a call in it must be atomic).

A request that ends with :attr:`~timers.ops.base.Call.after` calls (``WAIT``, ``WAITAOF``:
see :mod:`timers.ops.replication`) is sent as one plain pipeline on one connection: its atomic
calls (in an explicit MULTI/EXEC when there is more than one), then the ``after`` calls,
which count the writes of that connection. On a cluster that connection is to the node
that owns the slot of the request's keys.

Where scripts declare their keys (Redis Cluster: :mod:`timers.store.declare`), a script
call of a pipeline whose reply asks for keys wrote nothing: it is sent again, with those
keys, after the rest of its request (with the request's ``after`` calls, which count its
writes then), so it is not atomic with the rest of its request any more.

Both clients' ways are written once (:mod:`timers.store.steps`): :func:`_run` yields each
I/O step, and :func:`run_sync` and :func:`run_async` drive it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Mapping
from typing import Any

import redis.asyncio.cluster
import redis.exceptions

from timers.ops.base import Call, Request
from timers.store.cluster import is_cluster
from timers.store.declare import MAX_CALLS, Declaring, asked_keys, too_many, with_asked
from timers.store.script_manifest import ScriptName
from timers.store.steps import Steps, adrive, drive


def run_sync(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> list[Any]:
    """Send ``request`` and return one reply per call."""
    if len(request) == 1 and (call := request[0]).script is not None:  # the hot path
        return [scripts[call.script](keys=call.keys, args=call.args)]  # (see _send)
    return drive(_run(client, scripts, request))


async def run_async(
    client: Any, scripts: Mapping[ScriptName, Any], request: Request
) -> list[Any]:
    """:func:`run_sync` on an asyncio client."""
    if len(request) == 1 and (call := request[0]).script is not None:
        return [await scripts[call.script](keys=call.keys, args=call.args)]
    return await adrive(_run(client, scripts, request))


def _run(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> Steps[list[Any]]:
    """Send ``request``, then again what its script calls ask for keys (see the module
    docstring) while they ask; raises when some still ask after
    :data:`~timers.store.declare.MAX_CALLS` sends."""
    replies = yield from _send(client, scripts, request)
    if len(request) == 1 or not any(isinstance(scripts[c.script], Declaring)
                                    for c in request if c.script):
        return replies
    for _ in range(MAX_CALLS):
        again = _asked(client, request, replies)
        if again is None:
            return replies
        request, indexes, sub = again
        _merge(request, replies, indexes, (yield from _send(client, scripts, sub)))
    _raise_if_asking(request, replies)
    return replies


def _asked(client: Any, request: Request,
           replies: list[Any]) -> tuple[Request, list[int], Request] | None:
    """When script calls of ``request`` asked for keys: the request with those keys added
    to them, their indexes, and what to send again (they, then the ``after`` calls)."""
    indexes = [i for i, (call, reply) in enumerate(zip(request, replies, strict=True))
               if call.script is not None and not call.after
               and asked_keys(reply) is not None]
    if not indexes:
        return None
    request = list(request)
    for i in indexes:
        call = request[i]
        keys = with_asked(str(call.script), call.keys, asked_keys(replies[i]) or [],
                          is_cluster(client))
        request[i] = dataclasses.replace(call, keys=tuple(keys))
    return request, indexes, [request[i] for i in indexes] + [c for c in request if c.after]


def _merge(request: Request, replies: list[Any], indexes: list[int],
           again: list[Any]) -> None:
    """Take into ``replies`` those of the calls sent again, and of the ``after`` calls."""
    for i, reply in zip(indexes, again, strict=False):
        replies[i] = reply
    after = [i for i, call in enumerate(request) if call.after]
    for i, reply in zip(after, again[len(indexes):], strict=True):
        replies[i] = reply


def _raise_if_asking(request: Request, replies: list[Any]) -> None:
    for call, reply in zip(request, replies, strict=True):
        asked = asked_keys(reply) if call.script is not None and not call.after else None
        if asked is not None:
            raise too_many(str(call.script), asked)


def _send(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> Steps[list[Any]]:
    """One round trip. A pipeline on a cluster loads no scripts: each script is loaded on
    every primary first (once per client), and again after a NOSCRIPT (a replica promoted
    since has an empty script cache), when the whole request runs once more (every call
    timers pipelines is safe to repeat: schedules by id replace, reads read). A lone
    script call is the script's own call (which :func:`run_sync` and :func:`run_async`
    make without this generator: the hot path)."""
    if len(request) == 1 and (call := request[0]).script is not None:
        return [(yield functools.partial(scripts[call.script], keys=call.keys, args=call.args))]
    if request and request[-1].after:
        return (yield from _waiting(client, scripts, request))
    cluster = is_cluster(client)
    for attempt in (1, 2):
        if cluster:
            yield from _load(client, None, scripts, request, reload=attempt == 2)
        pipe = client.pipeline(transaction=any(c.atomic for c in request))
        for call in request:
            _queue(pipe, scripts, call)
        try:
            return list((yield pipe.execute))
        except redis.exceptions.NoScriptError:
            if attempt == 2 or not cluster:
                raise
    raise AssertionError("unreachable")


_LOADED: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
"""(where, sha) of the scripts loaded per client: where is a cluster node's name, or "" for
the client's own server (every primary, on a cluster)."""


def _load(client: Any, node: Any, scripts: Mapping[ScriptName, Any], request: Request,
          reload: bool) -> Steps[None]:
    """Load the scripts ``request`` calls, through ``client`` or on its cluster ``node``:
    once per client (and node), or (``reload``) again."""
    loaded = _LOADED.setdefault(client, set())
    where = "" if node is None else node.name
    for call in request:
        script = scripts[call.script] if call.script is not None else None
        if script is not None and (reload or (where, script.sha) not in loaded):
            yield (functools.partial(client.script_load, script.script) if node is None else
                   functools.partial(client.execute_command, "SCRIPT", "LOAD", script.script,
                                     target_nodes=node))
            loaded.add((where, script.sha))


def _queue(pipe: Any, scripts: Mapping[ScriptName, Any], call: Call) -> None:
    """Queue a call on a pipeline, sync or asyncio (whose Script call is a coroutine, so
    the script is queued by hand: the pipeline loads it before it runs, except on a
    cluster: see :func:`_send`)."""
    if call.script is None:
        pipe.execute_command(*call.command)
    else:
        script = scripts[call.script]
        if hasattr(pipe, "scripts"):
            pipe.scripts.add(script)
        # (a cluster pipeline refuses its evalsha(), not the command itself)
        pipe.execute_command("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)


# -- a write, then WAIT on its connection ---------------------------------------------

_REROUTE = (redis.exceptions.MovedError, redis.exceptions.AskError)
"""A cluster node's answer that the slot is elsewhere (nothing ran): ask again once."""


def _commands(scripts: Mapping[ScriptName, Any], request: Request) -> tuple[list[tuple[Any, ...]],
                                                                            bool]:
    """The commands of a request with ``after`` calls, and whether its writes are wrapped
    in MULTI/EXEC (more than one of them, one atomic: a lone script is atomic itself)."""
    writes = [c for c in request if not c.after]
    wrap = len(writes) > 1 and any(c.atomic for c in writes)
    commands: list[tuple[Any, ...]] = [("MULTI",)] if wrap else []
    for call in writes:
        if call.script is None:
            commands.append(call.command)
        else:
            commands.append(("EVALSHA", scripts[call.script].sha, len(call.keys), *call.keys,
                             *call.args))
    if wrap:
        commands.append(("EXEC",))
    commands += [c.command for c in request if c.after]
    return commands, wrap


def _replies(request: Request, raw: list[Any], wrap: bool) -> list[Any]:
    """One reply per call from the replies of :func:`_commands`; an error reply is raised
    (the first one: a write's before its transaction's), except an ``after`` call's that
    :attr:`~timers.ops.base.Call.may_fail`."""
    n = sum(1 for c in request if not c.after)
    if wrap:
        for reply in raw[1:n + 1]:  # MULTI's and each queued call's: OOM, a wrong arg …
            if isinstance(reply, Exception):
                raise reply
        done = raw[n + 1]
        if isinstance(done, Exception):
            raise done
        writes, rest = list(done), raw[n + 2:]
    else:
        writes, rest = raw[:n], raw[n:]
    for reply in writes:
        if isinstance(reply, Exception):
            raise reply
    for call, reply in zip((c for c in request if c.after), rest, strict=True):
        if isinstance(reply, Exception) and not call.may_fail:
            raise reply
    return writes + list(rest)


def _first_key(request: Request) -> str:
    return next(key for call in request for key in call.keys)


def _waiting(client: Any, scripts: Mapping[ScriptName, Any],
             request: Request) -> Steps[list[Any]]:
    """Send a request with ``after`` calls (see the module docstring). Each script is
    loaded once per connection target, and again after a NOSCRIPT (a promoted replica
    has an empty script cache), when the request runs once more: nothing of it ran. On
    a cluster, a MOVED reroutes it once, and a lost connection has the next call ask the
    cluster for its layout (the node may be gone)."""
    commands, wrap = _commands(scripts, request)
    cluster = is_cluster(client)
    for attempt in (1, 2):
        try:
            node = client.get_node_from_key(_first_key(request)) if cluster else None
            yield from _load(client, node, scripts, request, reload=attempt == 2)
            raw = yield functools.partial(_pipelined, client, node, commands)
            return _replies(request, list(raw), wrap)
        except (redis.exceptions.NoScriptError, *_REROUTE):
            if attempt == 2:
                raise
            if cluster:
                yield client.nodes_manager.initialize
        except redis.exceptions.ConnectionError:
            if cluster:
                with contextlib.suppress(*_LAYOUT_ERRORS):
                    yield client.nodes_manager.initialize
            raise
    raise AssertionError("unreachable")


_LAYOUT_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def _pipelined(client: Any, node: Any, commands: list[tuple[Any, ...]]) -> Any:
    """Send ``commands`` in one plain pipeline on one connection: the client's, or one to
    the cluster ``node`` (an asyncio cluster client's pipeline would send keyless WAIT to
    another node); their replies, an error as its exception (an awaitable of them, on an
    asyncio client)."""
    if isinstance(node, redis.asyncio.cluster.ClusterNode):
        return _on_async_node(node, commands)
    pipe = (client if node is None else client.get_redis_connection(node)).pipeline(
        transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)


async def _on_async_node(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    queued = [redis.asyncio.cluster.PipelineCommand(i, *c) for i, c in enumerate(commands)]
    await node.execute_pipeline(queued)
    return [c.result for c in queued]
