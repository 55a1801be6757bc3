"""Small helpers shared by the unit tests: drive the claim script, read the Redis clock, run
a listener in a burst."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import fakeredis

from tests.unit.conftest import ROOT, SAMPLE_TASKS
from timers import Listener
from timers.model import run_record
from timers.model.encoding import as_text
from timers.model.keys import Keyspace
from timers.store.script_calls import Invocation, ScriptCalls


def run(scripts: Mapping[Any, Any], call: Invocation) -> Any:
    """Run a script call (built by :class:`ScriptCalls`) with registered scripts."""
    return scripts[call.script](keys=list(call.keys), args=list(call.args))


@dataclass(frozen=True)
class Claimed:
    token: str
    run: str
    source: str
    died_on: str = ""
    """For a recovered run ("r"): the listener that held it before."""

    @property
    def reruns(self) -> int:
        return run_record.decode(self.run)[0]

    @property
    def due_ms(self) -> int:
        return run_record.decode(self.run)[2]

    @property
    def entry(self) -> str:
        """``<escaped id>:<record>``"""
        _, _, _, escaped, record = run_record.decode(self.run)
        return f"{escaped}:{record}"


@dataclass(frozen=True)
class ClaimReply:
    now_us: int
    next_due: int
    next_lease: int
    claimed: list[Claimed]

    @property
    def entries(self) -> list[str]:
        return [c.entry for c in self.claimed]


def claim(
    scripts: Mapping[Any, Any],
    keys: Keyspace,
    limit: int = 100,
    lease_ms: int = 15_000,
    event_ids: tuple[str, ...] = (),
    horizon_ms: int = 0,
    listener: str = "host:1:abc",
    groups: tuple[str, ...] = ("default",),
) -> ClaimReply:
    """Call the claim script as a listener does and parse its reply.

    ``horizon_ms`` 0 claims only timers already due on the Redis clock; ``groups``: those
    the listener serves.
    """
    reply = run(scripts, ScriptCalls(keys).claim(
        limit=limit, lease_ms=lease_ms, horizon_ms=horizon_ms, listener_id=listener,
        event_ids=event_ids, groups=groups))
    items = reply[3:]
    claimed = [
        Claimed(as_text(items[i]), as_text(items[i + 1]),
                *as_text(items[i + 2]).split("@", 1))
        for i in range(0, len(items), 3)
    ]
    return ClaimReply(int(reply[0]), int(reply[1]), int(reply[2]), claimed)


def redis_now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000



BURST_DEADLINE = 15.0
"""Seconds a listener of :func:`run_burst` has to run what is due."""


def make_listener(server: fakeredis.FakeServer, **options: Any) -> Listener:
    """A listener on the sample tasks package (call inside a running event loop)."""
    options.setdefault("tasks", SAMPLE_TASKS)
    options.setdefault("search_path", str(ROOT))
    return Listener(fakeredis.FakeAsyncRedis(server=server), **options)


async def burst(listener: Listener) -> None:
    """Run ``listener`` until nothing is due, then close its client."""
    await asyncio.wait_for(listener.run(burst=True), BURST_DEADLINE)
    await listener.redis.aclose()


def run_burst(server: fakeredis.FakeServer, before: Callable[[Listener], None] | None = None,
              **options: Any) -> Listener:
    """Run one listener of the sample tasks on ``server`` until nothing is due; ``before``
    may feed it events first; ``options``: the listener's."""

    async def scenario() -> Listener:
        listener = make_listener(server, **options)
        if before is not None:
            before(listener)
        await burst(listener)
        return listener

    return asyncio.run(scenario())
