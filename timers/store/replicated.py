"""A listener's runs start only once their claim is on a replica: ``replicas=n``.

Redis answers a claim before any replica has it. If the primary dies right after, the
promoted replica never saw the claim: the timer is due and unclaimed there, and a listener
runs it again as a first run, with no rerun counted. A listener given ``replicas=n`` sends
each claim, and each batch of endings (which may hand it the next run on a concurrency
key), with ``WAIT n timeout`` behind it, in the same round trip and on the same connection
(``WAIT`` counts its own connection's writes). A reply that fewer replicas had within the
timeout comes back as an :class:`UnreplicatedReply`: the listener starts none of the runs
it holds. Their claims stand on the primary and their leases lapse, so they run later as
reruns, counted as after a crash; should the primary die first, the promoted replica never
saw them claimed. Either way no run starts whose claim a failover can lose.

One primary and its replicas only (a plain URL or Sentinel): the listener refuses the
option on Redis Cluster and where scripts declare their keys.
"""

from __future__ import annotations

from typing import Any

import redis.exceptions

from timers.store.lua_library import AsyncFunction, eval_only, not_found, refused_functions


class UnreplicatedReply(list[Any]):
    """A script's reply whose write fewer replicas than asked had within the timeout."""

    def __init__(self, reply: Any, acked: int, replicas: int, timeout_ms: int) -> None:
        super().__init__(reply)
        self.acked, self.replicas, self.timeout_ms = acked, replicas, timeout_ms
        """How many replicas had it, of how many asked for, within how long."""

    def held_back(self, runs: int, how: str) -> str:
        """The log line for ``runs`` runs this reply gave (``how``: "claimed" …), which
        are not started."""
        return (f"{runs} run(s) {how}, but only {self.acked} of the {self.replicas} "
                f"replica(s) asked for had the write within {self.timeout_ms} ms: not "
                f"started (each runs after its lease, counted as a rerun)")


class ReplicatedScript:
    """A registered script (a function of the library, or a ``Script`` run by
    ``EVALSHA``) on an asyncio client, each call sent with ``WAIT`` behind it in one
    pipeline; called as the script is (``keys=``, ``args=``)."""

    def __init__(self, client: Any, runner: Any, replicas: int, timeout_ms: int) -> None:
        self.client, self.runner = client, runner
        self.replicas, self.timeout_ms = replicas, timeout_ms
        self.script: Any = getattr(runner, "fallback", runner)
        """The redis-py ``Script`` (its ``sha`` and text), for ``EVALSHA``."""

    async def __call__(self, keys: Any = (), args: Any = ()) -> Any:
        """The script's reply; an :class:`UnreplicatedReply` when too few replicas had the
        write in time. A server that lacks the function or script loads it and the call
        is sent once more (nothing of it ran); one that refuses functions is sent
        ``EVALSHA``."""
        wait = ("WAIT", self.replicas, self.timeout_ms)
        for attempt in range(3):
            command = self._command(list(keys), list(args))
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.execute_command(*command)
                pipe.execute_command(*wait)
                try:
                    reply, acked = await pipe.execute()
                except redis.exceptions.ResponseError as exc:
                    if attempt == 2 or not await self._loaded(command[0], exc):
                        raise
                    continue
            if int(acked) < self.replicas:
                return UnreplicatedReply(reply, int(acked), self.replicas, self.timeout_ms)
            return reply
        raise AssertionError("unreachable")

    def _command(self, keys: list[Any], args: list[Any]) -> tuple[Any, ...]:
        if isinstance(self.runner, AsyncFunction) and not eval_only(self.client):
            return ("FCALL", self.runner.name, len(keys), *keys, *args)
        return ("EVALSHA", self.script.sha, len(keys), *keys, *args)

    async def _loaded(self, sent: str, exc: redis.exceptions.ResponseError) -> bool:
        """After ``exc``: whether the missing function or script is loaded now (a server
        that refuses functions sends the client to ``EVALSHA``)."""
        if sent == "FCALL" and not_found(exc):
            await self.runner.aload(self.client)
            return True
        if sent == "FCALL" and refused_functions(self.client, exc):
            return True
        if sent == "EVALSHA" and isinstance(exc, redis.exceptions.NoScriptError):
            await self.client.script_load(self.script.script)
            return True
        return False
