"""Carrying one :class:`~timers.ops_base.Request` (a round trip) over a redis-py client,
sync or asyncio: a lone script call as EVALSHA, anything else as one pipeline (a
transaction when a call in it must be atomic)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import redis.exceptions

from timers.cluster import is_cluster
from timers.ops_base import Call, Request
from timers.scripts import ScriptName


def run_sync(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> list[Any]:
    """Send ``request`` and return one reply per call."""
    script = request[0].script if len(request) == 1 else None
    if script is not None:
        call = request[0]
        return [scripts[script](keys=list(call.keys), args=list(call.args))]
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
        for call in request:
            if call.script is not None:
                _loaded(client, scripts[call.script], reload=attempt == 2)
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


def _loaded(client: Any, script: Any, reload: bool) -> None:
    shas = _LOADED.setdefault(client, set())
    if reload or script.sha not in shas:
        client.script_load(script.script)
        shas.add(script.sha)


async def run_async(
    client: Any, scripts: Mapping[ScriptName, Any], request: Request
) -> list[Any]:
    script = request[0].script if len(request) == 1 else None
    if script is not None:
        call = request[0]
        return [await scripts[script](keys=list(call.keys), args=list(call.args))]
    if is_cluster(client):
        for call in request:  # as _cluster_pipeline, loading each script once per client
            if call.script is not None and scripts[call.script].sha not in _LOADED.get(
                    client, ()):
                await client.script_load(scripts[call.script].script)
                _LOADED.setdefault(client, set()).add(scripts[call.script].sha)
    pipe = client.pipeline(transaction=any(c.atomic for c in request))
    for call in request:
        _queue(pipe, scripts, call)
    return list(await pipe.execute())


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
