"""What a producer reads once, before its first write: the server's eviction policy and the
prefix's data format.

[`Timers`][timers.producer.client.Timers] and
[`AsyncTimers`][timers.producer.async_client.AsyncTimers] test :attr:`FirstWriteCheck.clear`
before each write (one attribute). Until it is set, they read, once per client:

- ``CONFIG GET maxmemory-policy`` (:mod:`timers.store.eviction`: warn once, or refuse
  when strict) and ``GET P|format`` (:mod:`timers.model.data_format`: refuse a format
  newer than this release knows), pipelined: one round trip. Where CONFIG is refused,
  ``INFO memory`` follows, in a second one. Redis Cluster
  pipelines carry no CONFIG: there each is a command of its own, two round trips.
- A format it cannot read (an ACL without ``GET`` on the key) is taken as unknown, like a
  policy it cannot read: nothing is said, and the writes go on.
- A server out of reach: nothing is kept and the next write reads again (the write itself
  raises what is wrong).

A format newer than this release raises [`UnknownFormat`][timers.exceptions.UnknownFormat]
before that write and every later one of the client; nothing is written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions

from timers.exceptions import UnknownFormat
from timers.model.data_format import refusal
from timers.store.cluster import is_cluster
from timers.store.eviction import EvictionGuard, policies
from timers.store.steps import Steps, adrive, drive

POLICY = "maxmemory-policy"
_REFUSED = (redis.exceptions.ResponseError,)
"""What a server that will not answer a read says (a managed service's CONFIG, an ACL)."""


@dataclass
class FirstWriteCheck:
    """One client's reads before its first write: the eviction policy and the data format."""

    format_key: str
    """``P|format`` of the prefix's one-shard keyspace (the home shard of a sharded one)."""
    eviction: EvictionGuard = field(default_factory=EvictionGuard)
    checked: bool = False
    clear: bool = False
    """Read, and nothing to refuse or warn of: a write goes straight on (one attribute
    test)."""
    refused: UnknownFormat | None = None
    """The refusal the stored format called for, or None."""

    def read_sync(self, client: Any) -> None:
        """Read both over a sync client (nothing if they were read already)."""
        if not self.checked:
            drive(self._read(client))

    async def read_async(self, client: Any) -> None:
        """:meth:`read_sync` over an asyncio client."""
        if not self.checked:
            await adrive(self._read(client))

    def _read(self, client: Any) -> Steps[None]:
        try:
            if is_cluster(client):
                config = yield from _or_error(functools.partial(client.config_get, POLICY))
                stored = yield from _or_error(functools.partial(client.get, self.format_key))
            else:
                pipe = client.pipeline(transaction=False)
                pipe.config_get(POLICY)
                pipe.get(self.format_key)
                config, stored = yield functools.partial(pipe.execute, raise_on_error=False)
            if isinstance(config, _REFUSED):
                config = yield from _or_error(functools.partial(client.info, "memory"))
        except redis.exceptions.RedisError:
            return  # not reachable now: the write says so; read again on the next one
        self._judge(config, stored)

    def _judge(self, config: Any, stored: Any) -> None:
        if self.checked:  # asyncio: first writes in flight at once each read; one judges
            return
        if not isinstance(stored, Exception):
            self.refused = refusal(stored, self.format_key, "producer")
        self.checked = True
        self.eviction.judge([] if isinstance(config, Exception) else policies(config))
        self.clear = self.refused is None and self.eviction.policy is None

    def refuse(self) -> None:
        """Raise before a write: [`UnknownFormat`][timers.exceptions.UnknownFormat] for a
        format newer than this release, then
        [`EvictionUnsafe`][timers.exceptions.EvictionUnsafe] if strict and the policy is
        ``allkeys-*``."""
        if self.refused is not None:
            raise UnknownFormat(str(self.refused), stored=self.refused.stored,
                                known=self.refused.known)
        self.eviction.refuse_if_strict()


def _or_error(read: Callable[[], Any]) -> Steps[Any]:
    """``read``'s reply, or the error a server that will not answer it gave."""
    try:
        return (yield read)
    except _REFUSED as exc:
        return exc
