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
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import redis.asyncio.cluster
import redis.exceptions

from timers.ops.base import Call, Request
from timers.store.cluster import is_cluster
from timers.store.declare import MAX_CALLS, Declaring, asked_keys, too_many, with_asked
from timers.store.script_manifest import ScriptName


def run_sync(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> list[Any]:
    """Send ``request`` and return one reply per call."""
    replies = _send_sync(client, scripts, request)
    if len(request) > 1 and _declaring(scripts, request):
        for again, merge in _resends(client, request, replies):
            merge(_send_sync(client, scripts, again))
    return replies


async def run_async(
    client: Any, scripts: Mapping[ScriptName, Any], request: Request
) -> list[Any]:
    """:func:`run_sync` on an asyncio client."""
    replies = await _send_async(client, scripts, request)
    if len(request) > 1 and _declaring(scripts, request):
        for again, merge in _resends(client, request, replies):
            merge(await _send_async(client, scripts, again))
    return replies


def _declaring(scripts: Mapping[ScriptName, Any], request: Request) -> bool:
    return any(isinstance(scripts[c.script], Declaring) for c in request if c.script)


def _resends(client: Any, request: Request, replies: list[Any]
             ) -> Iterator[tuple[Request, Callable[[list[Any]], None]]]:
    """Sans I/O, what :func:`run_sync` and :func:`run_async` send again while script calls
    of ``request`` ask for keys in ``replies`` (see the module docstring): each request,
    with what takes its replies into ``replies``. Raises when some still ask after
    :data:`~timers.store.declare.MAX_CALLS` sends."""
    for _ in range(MAX_CALLS):
        again = _asked(client, request, replies)
        if again is None:
            return
        request, indexes, sub = again
        yield sub, functools.partial(_merge, request, replies, indexes)
    _raise_if_asking(request, replies)


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


def _send_sync(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> list[Any]:
    script = request[0].script if len(request) == 1 else None
    if script is not None:
        call = request[0]
        return [scripts[script](keys=call.keys, args=call.args)]
    if request and request[-1].after:
        return _waiting_sync(client, scripts, request)
    if is_cluster(client):
        return _cluster_pipeline(client, scripts, request)
    pipe = client.pipeline(transaction=any(c.atomic for c in request))
    for call in request:
        _queue(pipe, scripts, call)
    return list(pipe.execute())


def _cluster_pipeline(client: Any, scripts: Mapping[ScriptName, Any],
                      request: Request) -> list[Any]:
    """A pipeline on a cluster, whose pipelines load no scripts: each script is loaded on
    every primary first (once per client), and again after a NOSCRIPT (a replica promoted
    since has an empty script cache), when the whole request runs once more (every call
    timers pipelines is safe to repeat: schedules by id replace, reads read)."""
    for attempt in (1, 2):
        _load(client, scripts, request, reload=attempt == 2)
        pipe = client.pipeline(transaction=any(c.atomic for c in request))
        for call in request:
            _queue(pipe, scripts, call)
        try:
            return list(pipe.execute())
        except redis.exceptions.NoScriptError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


_LOADED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _load(client: Any, scripts: Mapping[ScriptName, Any], request: Request,
          reload: bool) -> None:
    """Load the scripts ``request`` calls on ``client``: once per client, or (``reload``)
    again."""
    shas = _LOADED.setdefault(client, set())
    for script in (scripts[c.script] for c in request if c.script is not None):
        if reload or script.sha not in shas:
            client.script_load(script.script)
            shas.add(script.sha)


async def _load_async(client: Any, scripts: Mapping[ScriptName, Any], request: Request,
                      reload: bool) -> None:
    """:func:`_load` on an asyncio client."""
    shas = _LOADED.setdefault(client, set())
    for script in (scripts[c.script] for c in request if c.script is not None):
        if reload or script.sha not in shas:
            await client.script_load(script.script)
            shas.add(script.sha)


async def _send_async(
    client: Any, scripts: Mapping[ScriptName, Any], request: Request
) -> list[Any]:
    script = request[0].script if len(request) == 1 else None
    if script is not None:
        call = request[0]
        return [await scripts[script](keys=call.keys, args=call.args)]
    if request and request[-1].after:
        return await _waiting_async(client, scripts, request)
    if is_cluster(client):
        return await _cluster_pipeline_async(client, scripts, request)
    pipe = client.pipeline(transaction=any(c.atomic for c in request))
    for call in request:
        _queue(pipe, scripts, call)
    return list(await pipe.execute())


async def _cluster_pipeline_async(client: Any, scripts: Mapping[ScriptName, Any],
                                  request: Request) -> list[Any]:
    """:func:`_cluster_pipeline` on an asyncio client."""
    for attempt in (1, 2):
        await _load_async(client, scripts, request, reload=attempt == 2)
        pipe = client.pipeline(transaction=any(c.atomic for c in request))
        for call in request:
            _queue(pipe, scripts, call)
        try:
            return list(await pipe.execute())
        except redis.exceptions.NoScriptError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _queue(pipe: Any, scripts: Mapping[ScriptName, Any], call: Call) -> None:
    """Queue a call on a pipeline, sync or asyncio (whose Script call is a coroutine, so
    the script is queued by hand: the pipeline loads it before it runs, except on a
    cluster: see :func:`_cluster_pipeline`)."""
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


def _waiting_sync(client: Any, scripts: Mapping[ScriptName, Any],
                  request: Request) -> list[Any]:
    """Send a request with ``after`` calls (see the module docstring). Each script is
    loaded once per connection target, and again after a NOSCRIPT (a promoted replica
    has an empty script cache), when the request runs once more: nothing of it ran. On
    a cluster, a MOVED reroutes it once."""
    commands, wrap = _commands(scripts, request)
    for attempt in (1, 2):
        target = client
        if is_cluster(client):
            target = client.get_redis_connection(client.get_node_from_key(_first_key(request)))
        _load(target, scripts, request, reload=attempt == 2)
        pipe = target.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        try:
            return _replies(request, list(pipe.execute(raise_on_error=False)), wrap)
        except (redis.exceptions.NoScriptError, *_REROUTE):
            if attempt == 2:
                raise
            if is_cluster(client):
                client.nodes_manager.initialize()
        except redis.exceptions.ConnectionError:
            if is_cluster(client):  # the node may be gone: the next call asks the cluster
                _refresh_layout(client)
            raise
    raise AssertionError("unreachable")


_LAYOUT_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def _refresh_layout(client: Any) -> None:
    with contextlib.suppress(*_LAYOUT_ERRORS):
        client.nodes_manager.initialize()


async def _waiting_async(client: Any, scripts: Mapping[ScriptName, Any],
                         request: Request) -> list[Any]:
    """:func:`_waiting_sync` on an asyncio client."""
    commands, wrap = _commands(scripts, request)
    for attempt in (1, 2):
        try:
            if is_cluster(client):
                raw = await _on_cluster_node(client, scripts, request, commands, attempt == 2)
            else:
                await _load_async(client, scripts, request, reload=attempt == 2)
                pipe = client.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                raw = list(await pipe.execute(raise_on_error=False))
            return _replies(request, raw, wrap)
        except (redis.exceptions.NoScriptError, *_REROUTE):
            if attempt == 2:
                raise
            if is_cluster(client):
                await client.nodes_manager.initialize()
        except redis.exceptions.ConnectionError:
            if is_cluster(client):
                with contextlib.suppress(*_LAYOUT_ERRORS):
                    await client.nodes_manager.initialize()
            raise
    raise AssertionError("unreachable")


_LOADED_ON_NODES: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = (
    weakref.WeakKeyDictionary())
"""(node name, sha) of the scripts loaded on each node, per asyncio cluster client."""


async def _on_cluster_node(client: Any, scripts: Mapping[ScriptName, Any], request: Request,
                           commands: list[tuple[Any, ...]], reload: bool) -> list[Any]:
    """Send ``commands`` on one connection to the node that owns the request's slot (an
    asyncio cluster client's pipeline would send keyless WAIT to another node)."""
    node = client.get_node_from_key(_first_key(request))
    loaded = _LOADED_ON_NODES.setdefault(client, set())
    for call in request:
        script = scripts[call.script] if call.script is not None else None
        if script is not None and (reload or (node.name, script.sha) not in loaded):
            await client.execute_command("SCRIPT", "LOAD", script.script, target_nodes=node)
            loaded.add((node.name, script.sha))
    queued = [redis.asyncio.cluster.PipelineCommand(i, *c) for i, c in enumerate(commands)]
    await node.execute_pipeline(queued)
    return [c.result for c in queued]
