"""Carrying one :class:`~timers.ops_base.Request` (a round trip) over a redis-py client,
sync or asyncio: a lone script call as EVALSHA, anything else as one pipeline (a
transaction when a call in it must be atomic)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timers.ops_base import Call, Request
from timers.scripts import ScriptName


def run_sync(client: Any, scripts: Mapping[ScriptName, Any], request: Request) -> list[Any]:
    """Send ``request`` and return one reply per call."""
    script = request[0].script if len(request) == 1 else None
    if script is not None:
        call = request[0]
        return [scripts[script](keys=list(call.keys), args=list(call.args))]
    pipe = client.pipeline(transaction=any(c.atomic for c in request))
    for call in request:
        _queue(pipe, scripts, call)
    return list(pipe.execute())


async def run_async(
    client: Any, scripts: Mapping[ScriptName, Any], request: Request
) -> list[Any]:
    script = request[0].script if len(request) == 1 else None
    if script is not None:
        call = request[0]
        return [await scripts[script](keys=list(call.keys), args=list(call.args))]
    pipe = client.pipeline(transaction=any(c.atomic for c in request))
    for call in request:
        _queue(pipe, scripts, call)
    return list(await pipe.execute())


def _queue(pipe: Any, scripts: Mapping[ScriptName, Any], call: Call) -> None:
    """Queue a call on a pipeline, sync or asyncio (whose Script call is a coroutine, so
    the script is queued by hand: the pipeline loads it before it runs)."""
    if call.script is None:
        pipe.execute_command(*call.command)
    else:
        script = scripts[call.script]
        pipe.scripts.add(script)
        pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
