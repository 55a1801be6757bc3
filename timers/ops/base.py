"""What every operation yields and shares: round trips, and the readers of raw replies.

See :mod:`timers.ops.operations` for the operations themselves.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from timers.model.fast_init import fast_init
from timers.store.script_calls import Invocation
from timers.store.script_manifest import ScriptName

T = TypeVar("T")


@fast_init  # made once or more per schedule
@dataclass(frozen=True)
class Call:
    """One command in a round trip: a plain Redis command, or one of our Lua scripts."""

    command: tuple[Any, ...] = ()
    script: ScriptName | None = None
    keys: tuple[str, ...] = ()
    args: tuple[Any, ...] = ()
    atomic: bool = False
    """A round trip with an atomic call runs in MULTI/EXEC: all of it or none of it.
    Reads are not atomic, so they still work when Redis is out of memory (Redis refuses
    every command queued in a MULTI then)."""
    after: bool = False
    """Sent after the request's other calls (and their MULTI/EXEC), on the same connection,
    in the same round trip: ``WAIT`` and ``WAITAOF`` count the writes of their own
    connection (see :mod:`timers.ops.replication`). Such calls come last in a request."""
    may_fail: bool = False
    """An error reply is returned as the exception instead of raised (a command an older
    server does not know, e.g. ``WAITAOF`` before Redis 7.2)."""

    @classmethod
    def of(cls, invocation: Invocation, atomic: bool = False) -> Call:
        """A script call as :class:`timers.store.script_calls.ScriptCalls` builds it."""
        return cls(script=invocation.script, keys=invocation.keys, args=invocation.args,
                   atomic=atomic)


Request = list[Call]
Operation = Generator[Request, list[Any], T]


def ms_to_datetime(ms: float) -> datetime:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return datetime.min.replace(tzinfo=UTC) if ms < 0 else datetime.max.replace(tzinfo=UTC)


def live_heartbeats(now_ms: int, entries: Any,
                    infos: Any) -> list[tuple[str, dict[str, Any], float]]:
    """The live listeners' ids, heartbeats and deadlines (ms), from ``ZRANGE P|listeners 0
    -1 WITHSCORES`` and ``HGETALL P|listener`` (RESP2 lists or RESP3 maps): those whose
    deadline is after ``now_ms`` and whose heartbeat reads as a JSON object."""
    info = {_text(k): _text(v) for k, v in pairs(infos)}
    live = []
    for listener_id, deadline in pairs(entries):
        name = _text(listener_id)
        if float(deadline) <= now_ms or name not in info:
            continue
        try:
            beat = json.loads(info[name])
        except ValueError:
            continue
        if isinstance(beat, dict):
            live.append((name, beat, float(deadline)))
    return live


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def pairs(flat: Any) -> list[tuple[Any, Any]]:
    """A reply of pairs as a list of them: ``HGETALL``'s, a flat list in RESP2, a map in
    RESP3; ``ZRANGE … WITHSCORES``', a flat list in RESP2, pairs in RESP3."""
    if isinstance(flat, dict):
        return list(flat.items())
    if not flat:
        return []
    if isinstance(flat[0], list | tuple):
        return [(a, b) for a, b in flat]
    return list(zip(flat[0::2], flat[1::2], strict=True))


