"""The asyncio producer API: [`AsyncTimers`][timers.producer.async_client.AsyncTimers], the twin of
[`timers.Timers`][timers.producer.client.Timers]: each of its operations is the `Timers` method
of the same name (its parameters, its docstring, its work), awaited."""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis
import redis.asyncio

from timers.model.encoding import Args
from timers.ops.operations import Operation, Prepared, TimerSpec
from timers.ops.replication import Replication
from timers.producer.base import Producer
from timers.producer.client import Timers
from timers.producer.coalesce import Coalescer
from timers.producer.loops import LoopBinding
from timers.producer.task_check import tasks_of
from timers.producer.transport import run_async
from timers.store import connect
from timers.store.connect import AsyncScriptConnection, async_client

__all__ = ["AsyncTimers"]

T = TypeVar("T")
P = ParamSpec("P")


def awaited(method: Callable[Concatenate[Timers, P], T]
            ) -> Callable[Concatenate[AsyncTimers, P], Coroutine[Any, Any, T]]:
    """The coroutine method made from a `Timers` method: it does the method's own work, whose
    last step (``run`` or ``_write``) is `AsyncTimers`' coroutine, and awaits it. Its name,
    docstring and signature are the method's."""

    async def call(self: AsyncTimers, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await method(self, *args, **kwargs)  # type: ignore[arg-type, misc, no-any-return]

    call.__name__, call.__doc__ = method.__name__, method.__doc__
    call.__module__, call.__qualname__ = __name__, f"AsyncTimers.{method.__name__}"
    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return call


class AsyncTimers(Producer[redis.asyncio.Redis | redis.asyncio.RedisCluster]):
    """The asyncio twin of [`Timers`][timers.producer.client.Timers]: the same methods, awaited.

    It takes the same options as [`Timers`][timers.producer.client.Timers], with a
    ``redis.asyncio.Redis`` where that takes a ``redis.Redis``. It belongs to the event loop
    that first uses it (its connections do): a call from another loop raises
    [`WrongEventLoop`][timers.exceptions.WrongEventLoop] before sending anything. Make one per
    loop (e.g. in an app's lifespan, ``async with AsyncTimers(url) as t``) or use
    [`timers.aio`][asyncio-timersaio], which keeps one per loop. A ``redis.asyncio.Redis`` given
    by the app is the app's to close: [`aclose`][timers.producer.async_client.AsyncTimers.aclose]
    leaves it open.
    """

    def _connect(self, redis_: str | redis.asyncio.Redis | redis.asyncio.RedisCluster | None,
                 max_connections: int | None
                 ) -> redis.asyncio.Redis | redis.asyncio.RedisCluster:
        self._loop = LoopBinding()
        self._coalescers: dict[Replication | None, Coalescer[Prepared]] = {}
        """One per distinct ask for replicas (None: the calls that wait for none)."""
        self._coalescer = self._waiting(None)
        if isinstance(redis_, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            return redis_
        return async_client(redis_, max_connections)

    def _kept_connection(self) -> AsyncScriptConnection | None:
        return AsyncScriptConnection.of(self.redis) if self._owns_client else None

    async def run(self, operation: Operation[T]) -> T:
        """Drive one operation to its result, as [`Timers.run`][timers.producer.client.Timers.run]
        (on this client's loop)."""
        if connect.in_memory_server is not None:
            connect.refuse_outside_test_server(self.redis, "this AsyncTimers")
        self._loop.claim()
        try:
            request = next(operation)
            while True:
                try:
                    reply = await run_async(self.redis, self._scripts, request)
                except redis.exceptions.RedisError as exc:
                    request = self._failed(operation, exc)
                    continue
                request = operation.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _write(self, operation: Operation[T],
                     tasks: builtins.list[tuple[str, str]] | None = None) -> T:
        """[`Timers._write`][timers.producer.client.Timers._write], awaited."""
        await self._check(tasks)
        return await self.run(operation)

    async def _check(self, tasks: builtins.list[tuple[str, str]] | None) -> None:
        """Make the reads of the checks before a write (`Producer._checks`)."""
        for read in self._checks(tasks):
            await (self.first_write.read_async(self.redis) if read is None else self.run(read))

    def _waiting(self, wanted: Replication | None) -> Coalescer[Prepared]:
        """The coalescer of the calls that ask for ``wanted``."""
        coalescer = self._coalescers.get(wanted)
        if coalescer is None:
            coalescer = self._coalescers[wanted] = Coalescer(
                lambda batch: self.run(self.ops.write(batch, wanted)), lambda p: p.timer_id)
        return coalescer

    async def schedule(
        self,
        task: str,
        args: Args | tuple[Any, ...] = None,
        *,
        in_: float | timedelta | None = None,
        at: datetime | None = None,
        id: str | None = None,
        max_lateness: float | timedelta | None = None,
        group: str | None = None,
        key: str | None = None,
        priority: int = 0,
        replicas: int | None = None,
        replicas_timeout: float | None = None,
    ) -> str:
        """[`Timers.schedule`][timers.producer.client.Timers.schedule], awaited: calls in
        flight at once share round trips (see `timers.producer.coalesce`), and with
        ``replicas`` their ``WAIT`` too. (Written out, not made by `awaited`: the hottest
        call of the API, it saves the wrapper's call; `tests/unit/test_api_parity.py` keeps
        its parameters `Timers.schedule`'s.)"""
        self._loop.claim()
        spec = TimerSpec(task, args, in_, at, id, max_lateness, group, key, priority)
        if not self.first_write.clear or self._unasked(spec):  # (else nothing to await)
            await self._check(tasks_of([spec], self.ops.group))
        wanted = self.replicas.for_call(replicas, replicas_timeout)
        coalescer = self._coalescer if wanted is None else self._waiting(wanted)
        return await coalescer.schedule(self.ops.prepare(spec))

    schedule_many = awaited(Timers.schedule_many)
    reschedule = awaited(Timers.reschedule)
    cancel = awaited(Timers.cancel)
    get = awaited(Timers.get)
    status = awaited(Timers.status)
    history = awaited(Timers.history)
    series = awaited(Timers.series)
    tasks_seen = awaited(Timers.tasks_seen)
    list = awaited(Timers.list)
    failed = awaited(Timers.failed)
    stats = awaited(Timers.stats)
    get_failure = awaited(Timers.get_failure)
    get_failures = awaited(Timers.get_failures)
    retry_failure = awaited(Timers.retry_failure)
    retry_all_failures = awaited(Timers.retry_all_failures)
    purge_failures = awaited(Timers.purge_failures)
    listeners = awaited(Timers.listeners)
    every = awaited(Timers.every)
    unschedule_recurring = awaited(Timers.unschedule_recurring)
    pause = awaited(Timers.pause)
    resume = awaited(Timers.resume)
    get_recurrence = awaited(Timers.get_recurrence)
    recurrences = awaited(Timers.recurrences)

    async def aclose(self) -> None:
        """Close the client's connections, if timers made the client (from a URL); on the
        loop it belongs to ([`WrongEventLoop`][timers.exceptions.WrongEventLoop] from another)."""
        if self._owns_client:
            self._loop.claim()
            for coalescer in list(self._coalescers.values()):
                await coalescer.drain()
            await self.redis.aclose()

    async def __aenter__(self) -> AsyncTimers:
        self._loop.claim()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
