"""The asyncio producer API: [`AsyncTimers`][timers.producer.async_client.AsyncTimers], the twin of
[`timers.Timers`][timers.producer.client.Timers]."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

import redis
import redis.asyncio

from timers.model.cron import CatchUp, Recurrence, recurrence
from timers.model.encoding import DEFAULT_MAX_ARGS_BYTES, Args
from timers.model.flow.names import configured_group
from timers.model.history import HistoryRecord, MinuteStats
from timers.ops.fleet import read_fleet
from timers.ops.operations import (
    Failure,
    Operation,
    PendingTimer,
    Prepared,
    RetrySummary,
    Stats,
    TimerSpec,
    TimerStatus,
)
from timers.ops.replication import ReplicaPolicy, Replication, in_memory
from timers.ops.sharded import operations_for
from timers.producer.coalesce import Coalescer
from timers.producer.loops import LoopBinding
from timers.producer.task_check import TaskCheck, tasks_of
from timers.producer.transport import run_async
from timers.store import connect
from timers.store.connect import AsyncScriptConnection, async_client
from timers.store.eviction import EvictionGuard
from timers.store.first_write import FirstWriteCheck
from timers.store.script_modes import register_all
from timers.store.server_errors import out_of_memory, translate

__all__ = ["AsyncTimers"]

T = TypeVar("T")


class AsyncTimers:
    """The asyncio twin of [`Timers`][timers.producer.client.Timers]: the same methods, awaited.

    It belongs to the event loop that first uses it (its connections do): a call from
    another loop raises [`WrongEventLoop`][timers.exceptions.WrongEventLoop] before sending
    anything. Make one per loop (e.g. in an app's lifespan, ``async with AsyncTimers(url) as t``) or
    use [`timers.aio`][asyncio-timersaio], which keeps one per loop. A ``redis.asyncio.Redis`` given
    by the app is the app's to close: [`aclose`][timers.producer.async_client.AsyncTimers.aclose]
    leaves it open. ``strict``: as [`Timers`][timers.producer.client.Timers]' (refuse an
    ``allkeys-*`` server rather than warn once); ``strict_tasks``: refuse a task no live listener
    announces (see `timers.producer.task_check`); ``replicas``, ``replicas_timeout`` and
    ``replicas_fsync`` as for [`Timers`][timers.producer.client.Timers].
    """

    def __init__(
        self,
        redis_: str | redis.asyncio.Redis | None = None,
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
        if isinstance(redis_, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            self.redis = redis_
            self._owns_client = False
        else:
            self.redis = async_client(redis_, max_connections)
            self._owns_client = True
        self.ops = operations_for(self.redis, prefix, shards, max_args_bytes,
                                  configured_group(group))
        self.keys = self.ops.home
        """The prefix's one-shard keyspace (its only one unless it is sharded)."""
        self._scripts = register_all(
            self.redis, AsyncScriptConnection.of(self.redis) if self._owns_client else None)
        self.replicas = ReplicaPolicy(replicas, replicas_timeout, replicas_fsync,
                                      in_memory=in_memory(self.redis))
        """Replicas each write waits for (see `timers.ops.replication`)."""
        self._loop = LoopBinding()
        self._coalescer: Coalescer[Prepared] = Coalescer(
            lambda batch: self.run(self.ops.write(batch)), lambda p: p.timer_id)
        self._coalescers: dict[Replication, Coalescer[Prepared]] = {}
        """Those of calls that wait for replicas, one per distinct ask."""
        self.eviction = EvictionGuard(strict)
        """The server's eviction policy, read on the first write (see
        `timers.store.eviction`)."""
        self.first_write = FirstWriteCheck(self.keys.data_format, self.eviction)
        """What the first write reads: the eviction policy and the prefix's data format
        (see `timers.store.first_write`)."""
        self.task_check = TaskCheck(strict_tasks)
        """The tasks it scheduled that a live listener was asked about (once each, see
        `timers.producer.task_check`)."""

    async def _writing(self) -> None:
        """Before a write: the first time, read the eviction policy (warn once, or raise if
        strict) and the prefix's data format (raise if newer than this release knows), in
        one round trip; raise again before every later write that must be refused."""
        check = self.first_write
        if check.clear:  # the common case: one test
            return
        if not check.checked:
            await check.read_async(self.redis)
        check.refuse()

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
                except redis.exceptions.OutOfMemoryError as exc:
                    request = operation.throw(out_of_memory(exc))
                    continue
                except redis.exceptions.RedisError as exc:
                    operation.close()
                    raise translate(exc, self.redis) from exc
                request = operation.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _check_tasks(self, pairs: builtins.list[tuple[str, str]]) -> None:
        """The first time a task (in a group) is scheduled: whether a live listener
        announces it (one round trip; `timers.producer.task_check`)."""
        todo = self.task_check.unchecked(pairs)
        if todo:
            self.task_check.judge(await self.run(read_fleet(self.keys)), todo)

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
        """Run ``task`` later; returns the id. The parameters are
        [`Timers.schedule`][timers.producer.client.Timers.schedule]'s. Calls in flight at once share
        round trips (see `timers.producer.coalesce`), and with ``replicas`` their ``WAIT`` too."""
        self._loop.claim()
        spec = TimerSpec(task, args, in_, at, id, max_lateness, group, key, priority)
        if not self.first_write.clear:  # (else no coroutine to await)
            await self._writing()
        if (task, group or self.ops.group) not in self.task_check.checked:  # (first time)
            await self._check_tasks(tasks_of([spec], self.ops.group))
        wanted = self.replicas.for_call(replicas, replicas_timeout)
        coalescer = self._coalescer if wanted is None else self._waiting(wanted)
        return await coalescer.schedule(self.ops.prepare(spec))

    def _waiting(self, wanted: Replication) -> Coalescer[Prepared]:
        """The coalescer of the calls that ask for ``wanted``."""
        coalescer = self._coalescers.get(wanted)
        if coalescer is None:
            coalescer = self._coalescers[wanted] = Coalescer(
                lambda batch: self.run(self.ops.write(batch, wanted)), lambda p: p.timer_id)
        return coalescer

    async def schedule_many(
        self, specs: Iterable[TimerSpec | Mapping[str, Any]], *,
        replicas: int | None = None, replicas_timeout: float | None = None,
    ) -> builtins.list[str]:
        """Schedule many timers in one round trip; returns their ids in order.

        All or nothing: an invalid timer, or a server out of memory
        ([`ServerOutOfMemory`][timers.exceptions.ServerOutOfMemory]), fails the whole call with
        nothing written. With ``replicas``, too few replicas in time raise
        [`NotReplicated`][timers.exceptions.NotReplicated] once every timer is written, naming the
        ids not confirmed."""
        await self._writing()
        specs = builtins.list(specs)
        await self._check_tasks(tasks_of(specs, self.ops.group))
        return await self.run(self.ops.schedule_many(
            specs, replication=self.replicas.for_call(replicas, replicas_timeout)))

    async def reschedule(
        self, id: str, *, in_: float | timedelta | None = None, at: datetime | None = None,
        replicas: int | None = None, replicas_timeout: float | None = None,
    ) -> bool:
        """Move a pending timer to a new due time. False if it is not pending."""
        await self._writing()
        return await self.run(self.ops.reschedule(
            id, in_, at, self.replicas.for_call(replicas, replicas_timeout)))

    async def cancel(self, id: str, *, replicas: int | None = None,
                     replicas_timeout: float | None = None) -> bool:
        """True if the timer was pending: it will now never fire."""
        return await self.run(self.ops.cancel(
            id, self.replicas.for_call(replicas, replicas_timeout)))

    async def get(self, id: str) -> PendingTimer | None:
        """The pending timer with this id, or None."""
        return await self.run(self.ops.get(id))

    async def status(self, id: str) -> TimerStatus:
        """Where the timer is: pending, waiting (on a key, a rate, a group or a retry),
        running (where), completed, skipped, dead, cancelled, or unknown (never existed
        or ended longer ago than the history keeps); see
        [`TimerStatus`][timers.ops.status.TimerStatus]."""
        return await self.run(self.ops.status(id))

    async def history(self, task: str | None = None, since: float | None = None,
                      failed: bool = False,
                      limit: int = 100) -> builtins.list[HistoryRecord]:
        """Ended timers, newest end first (see
        [`Timers.history`][timers.producer.client.Timers.history])."""
        return await self.run(self.ops.history(task, since, failed, limit))

    async def series(self, task: str | None = None,
                     minutes: int = 60) -> builtins.list[MinuteStats]:
        """Per-minute figures of a task or of all, oldest first (see
        [`Timers.series`][timers.producer.client.Timers.series])."""
        return await self.run(self.ops.series(task, minutes))

    async def tasks_seen(self) -> builtins.list[str]:
        """The tasks with a series: runs of them ended in the last 24 h."""
        return await self.run(self.ops.tasks_seen())

    async def list(self, limit: int = 100, group: str | None = None,
                   key: str | None = None) -> builtins.list[PendingTimer]:
        """Pending timers (waiting ones too), soonest first: of every group, or of
        ``group``; with ``key``, those waiting for that concurrency key, then the rest
        that name it."""
        return await self.run(self.ops.list_pending(limit, group, key))

    async def failed(self, limit: int = 100) -> builtins.list[Failure]:
        """Failed and refused timers, most recent first."""
        return await self.run(self.ops.list_failed(limit))

    async def stats(self) -> Stats:
        """Counts over every shard: pending (waiting ones too), running, failed, the
        counters (fired, reruns, …), and per group, key and rate limit what waits."""
        return await self.run(self.ops.stats())

    async def get_failure(self, id: str) -> Failure | None:
        """The latest failure record of a timer id (or a ``:…`` rejected key)."""
        return await self.run(self.ops.get_failure(id))

    async def get_failures(self, id: str) -> builtins.list[Failure]:
        """Every failure record of a timer id (one per dead timer), most recent first."""
        return await self.run(self.ops.get_failures(id))

    async def retry_failure(self, failure: Failure, *, replace: bool = False) -> str:
        """Schedule a failed timer again, due now; returns its id. Raises
        [`TimerAlreadyPending`][timers.exceptions.TimerAlreadyPending] if its id is pending again,
        unless ``replace``."""
        await self._writing()
        return await self.run(self.ops.retry_failure(failure, replace))

    async def retry_all_failures(self, *, replace: bool = False) -> RetrySummary:
        """Retry every failed timer; skips (and counts) ids pending again and rejected keys."""
        await self._writing()
        return await self.run(self.ops.retry_all_failures(replace))

    async def purge_failures(self, older_than: float | None = None) -> int:
        """Delete failure records older than ``older_than`` seconds (all if None)."""
        ms = None if older_than is None else round(older_than * 1000)
        return await self.run(self.ops.purge_failures(ms))

    async def listeners(self) -> builtins.list[dict[str, Any]]:
        """The live listeners, from their heartbeats."""
        return await self.run(self.ops.listeners())

    async def every(
        self,
        name: str,
        task: str,
        args: Args | tuple[Any, ...] = None,
        *,
        cron: str | None = None,
        interval: float | timedelta | None = None,
        tz: str = "UTC",
        catch_up: CatchUp = "latest",
        max_lateness: float | timedelta | None = None,
        overlap: bool = True,
        group: str | None = None,
        key: str | None = None,
        priority: int = 0,
    ) -> Recurrence:
        """Run ``task`` on a schedule under ``name``: ``cron`` (an expression read in the
        wall time of ``tz``, e.g. ``"0 9 * * mon-fri"``) or ``interval`` (seconds or a
        timedelta). Declaring it again unchanged does nothing; changed, it is replaced at
        once. ``catch_up`` ("latest", "all", "none") says what runs after every listener
        was down; ``max_lateness`` bounds how late an occurrence may start;
        ``overlap=False`` skips an occurrence while the previous run is still running.
        ``group``, ``key`` and ``priority`` are its occurrences', as in
        [`schedule`][timers.producer.async_client.AsyncTimers.schedule] (``group`` None: this
        client's).
        """
        spec = recurrence(name, task, args, cron=cron, interval=interval, tz=tz,
                          catch_up=catch_up, max_lateness=max_lateness, overlap=overlap,
                          max_args_bytes=self.ops.max_args_bytes,
                          group=self.ops.group if group is None else group, key=key,
                          priority=priority)
        await self._writing()
        return await self.run(self.ops.every(spec))

    async def unschedule_recurring(self, name: str) -> bool:
        """Delete a recurrence and its pending occurrence; False if there was none."""
        return await self.run(self.ops.unschedule_recurring(name))

    async def pause(self, name: str) -> bool:
        """Stop a recurrence until [`resume`][timers.producer.async_client.AsyncTimers.resume];
        False if there is none by that name."""
        return await self.run(self.ops.pause(name))

    async def resume(self, name: str) -> bool:
        """Schedule a paused recurrence again, from now; False if there is none."""
        await self._writing()
        return await self.run(self.ops.resume(name))

    async def get_recurrence(self, name: str) -> Recurrence | None:
        """The recurrence called ``name`` (its definition, state and next run), or None."""
        return await self.run(self.ops.get_recurrence(name))

    async def recurrences(self) -> builtins.list[Recurrence]:
        """Every recurrence, by name."""
        return await self.run(self.ops.recurrences())

    async def aclose(self) -> None:
        """Close the client's connections, if timers made the client (from a URL); on the
        loop it belongs to ([`WrongEventLoop`][timers.exceptions.WrongEventLoop] from another)."""
        if self._owns_client:
            self._loop.claim()
            await self._coalescer.drain()
            for coalescer in list(self._coalescers.values()):
                await coalescer.drain()
            await self.redis.aclose()

    async def __aenter__(self) -> AsyncTimers:
        self._loop.claim()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
