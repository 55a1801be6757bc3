"""A listener's runs start only once their claim is on a replica: ``replicas=n``.

Redis answers a claim before any replica has it. If the primary dies right after, the
promoted replica never saw the claim: the timer is due and unclaimed there, and a listener
runs it again as a first run, with no rerun counted. A listener given ``replicas=n`` sends
each claim, and each batch of endings (which may hand it the next run on a concurrency
key), with ``WAIT n timeout`` behind it, in the same round trip and on the same connection
(``WAIT`` counts its own connection's writes). A reply that fewer replicas had within the
timeout comes back as an :class:`UnreplicatedReply`: the listener starts none of the runs
it holds, and after a claim so answered claims nothing until ``WAIT n`` alone finds the
replicas (:mod:`timers.listener.finding.guards`). Their claims stand on the primary and
their leases lapse, so they run later as reruns, counted as after a crash; should the
primary die first, the promoted replica never saw them claimed. Either way no run starts
whose claim a failover can lose.

One primary and its replicas only (a plain URL or Sentinel): the listener refuses the
option on Redis Cluster and where scripts declare their keys.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class UnreplicatedReply(list[Any]):
    """A script's reply whose write fewer replicas than asked had within the timeout."""

    def __init__(self, reply: Any, acked: int, replicas: int, timeout_ms: int,
                 ask_again: Callable[[], Awaitable[int]]) -> None:
        super().__init__(reply)
        self.acked, self.replicas, self.timeout_ms = acked, replicas, timeout_ms
        """How many replicas had it, of how many asked for, within how long."""
        self.ask_again = ask_again
        """``WAIT`` alone, as sent behind the write: how many replicas are in sync now."""

    def held_back(self, runs: int, how: str) -> str:
        """The log line for ``runs`` runs this reply gave (``how``: "claimed" …), which
        are not started."""
        return (f"{runs} run(s) {how}, but only {self.acked} of the {self.replicas} "
                f"replica(s) asked for had the write within {self.timeout_ms} ms: not "
                f"started (each runs after its lease, counted as a rerun)")


class ReplicatedScript:
    """A registered script (a function of the library, or a ``Script`` run by
    ``EVALSHA``) on an asyncio client, called as the script is (``keys=``, ``args=``):
    it runs the script with itself as the client, whose :meth:`execute_command` sends
    each of the script's calls with ``WAIT`` behind it in one pipeline. The script does
    the rest as on any client: a server that lacks the function or script loads it and
    the call is sent once more (nothing of it ran); one that refuses functions is sent
    ``EVALSHA``, from its first refusal to this object on
    (:class:`~timers.store.lua_library.AsyncFunction`)."""

    def __init__(self, client: Any, runner: Any, replicas: int, timeout_ms: int) -> None:
        self.client, self.runner = client, runner
        self.replicas, self.timeout_ms = replicas, timeout_ms
        self.script_load, self.function_load = client.script_load, client.function_load
        """Loads go to the client as they are."""

    def __call__(self, keys: Any = (), args: Any = ()) -> Any:
        """The script's reply (an awaitable of it); an :class:`UnreplicatedReply` when too
        few replicas had the write in time."""
        return self.runner(keys=keys, args=args, client=self)

    async def execute_command(self, *command: Any) -> Any:
        """``command``'s reply, ``command`` sent with ``WAIT`` behind it on one connection
        (an :class:`UnreplicatedReply` when too few replicas had it in time)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.execute_command(*command)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
            reply, acked = await pipe.execute()
        if int(acked) < self.replicas:
            return UnreplicatedReply(reply, int(acked), self.replicas, self.timeout_ms,
                                     self.in_sync)
        return reply

    async def in_sync(self) -> int:
        """How many replicas are in sync: ``WAIT`` alone, which returns once
        :attr:`replicas` of them have acknowledged this connection's last write, or at the
        timeout. A replica counts from the end of its first sync."""
        return int(await self.client.execute_command("WAIT", self.replicas, self.timeout_ms))

    def evalsha(self, *args: Any) -> Any:
        """A ``Script``'s call: ``EVALSHA``, as :meth:`execute_command` sends it."""
        return self.execute_command("EVALSHA", *args)
