"""What both producer clients hold: [`Producer`][timers.producer.base.Producer], the base of
[`Timers`][timers.producer.client.Timers] (sync) and
[`AsyncTimers`][timers.producer.async_client.AsyncTimers] (asyncio): the redis-py client, the
prefix's operations, the replication policy, the checks before a write as a sans-I/O step
whose reads each client makes, and what a failed round trip does.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import redis

from timers.model.encoding import DEFAULT_MAX_ARGS_BYTES
from timers.model.flow.names import configured_group
from timers.ops.base import Operation, Request
from timers.ops.operations import TimerSpec
from timers.ops.replication import ReplicaPolicy, in_memory
from timers.ops.sharded import operations_for
from timers.producer.task_check import TaskCheck
from timers.store.eviction import EvictionGuard
from timers.store.first_write import FirstWriteCheck
from timers.store.script_modes import register_all
from timers.store.server_errors import out_of_memory, translate

__all__ = ["Producer"]

RedisClient = TypeVar("RedisClient")


class Producer(Generic[RedisClient]):
    """What both clients hold: the redis-py client (a ``RedisClient``), the prefix's operations,
    the replication policy and the first-write and task checks. Its subclasses say how to
    make a client from a URL and how to carry a round trip."""

    def __init__(
        self,
        redis_: str | RedisClient | None = None,
        *,
        prefix: str | None = None,
        max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
        max_connections: int | None = None,
        group: str | None = None,
        shards: int | None = None,
        strict: bool = False,
        strict_tasks: bool = False,
        replicas: int | None = None,
        replicas_timeout: float | None = None,
        replicas_fsync: bool = False,
    ) -> None:
        self.redis: RedisClient = self._connect(redis_, max_connections)
        """The redis-py client: the one given, or one made from the URL."""
        self._owns_client = self.redis is not redis_
        self.ops = operations_for(self.redis, prefix, shards, max_args_bytes,
                                  configured_group(group))
        self.keys = self.ops.home
        """The prefix's one-shard keyspace (its only one unless it is sharded)."""
        self._scripts = register_all(self.redis, self._kept_connection())
        self.replicas = ReplicaPolicy(replicas, replicas_timeout, replicas_fsync,
                                      in_memory=in_memory(self.redis))
        """Replicas each write waits for (see `timers.ops.replication`)."""
        self.eviction = EvictionGuard(strict)
        """The server's eviction policy, read on the first write (see
        `timers.store.eviction`)."""
        self.first_write = FirstWriteCheck(self.keys.data_format, self.eviction)
        """What the first write reads: the eviction policy and the prefix's data format
        (see `timers.store.first_write`)."""
        self.task_check = TaskCheck(strict_tasks)
        """The tasks it scheduled that a live listener was asked about (once each, see
        `timers.producer.task_check`)."""

    def _connect(self, redis_: str | RedisClient | None,
                 max_connections: int | None) -> RedisClient:
        """The client given, or a new one made from the URL (None: the configured one)."""
        raise NotImplementedError

    def _kept_connection(self) -> Any:
        """The connection script calls keep (see `timers.store.script_modes`), or None."""
        raise NotImplementedError

    def _unasked(self, spec: TimerSpec) -> bool:
        """Whether no live listener was asked about ``spec``'s task (in its group) yet."""
        return (spec.task, spec.group or self.ops.group) not in self.task_check.checked

    def _failed(self, operation: Operation[Any], exc: redis.exceptions.RedisError) -> Request:
        """The next request of ``operation`` after its round trip failed with ``exc``: a
        write Redis refused for want of memory is thrown into it as `ServerOutOfMemory`; any
        other error closes it and is raised as a `TimersError` (see ``run``)."""
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            return operation.throw(out_of_memory(exc))
        operation.close()
        raise translate(exc, self.redis) from exc

    def _checks(self, tasks: builtins.list[tuple[str, str]] | None
                ) -> Iterator[Operation[None] | None]:
        """The checks before a write, sans I/O: it yields their reads for its runner
        (``_write``). The first time, the eviction policy and the prefix's data format, in one
        round trip (None: `FirstWriteCheck.read_sync` or ``read_async``); then it refuses a
        write they call to refuse (this and every later one). For the (task, group) pairs of
        ``tasks`` not asked about yet, whether a live listener announces them (an operation:
        one round trip; `timers.producer.task_check`)."""
        check = self.first_write
        if not check.clear:  # (the common case: one test)
            if not check.checked:
                yield None
            check.refuse()
        todo = self.task_check.unchecked(tasks) if tasks else None
        if todo:
            yield self.task_check.ask(self.keys, todo)
