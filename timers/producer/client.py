"""The producer API, written once: [`Timers`][timers.producer.client.Timers] (sync) holds every
operation; [`AsyncTimers`][timers.producer.async_client.AsyncTimers] (asyncio, in
`timers.producer.async_client`) offers each of them awaited, made from these methods.

Both are thin: they run the operations of `timers.ops.operations` over a redis-py client,
and hold the same state (`timers.producer.base.Producer`). Each method here does its own
work (checking its arguments, building an operation) and ends in one call the client
carries out its own way: ``run`` (an operation) or ``_write`` (an operation that writes,
after the first-write and task checks). `AsyncTimers.schedule`, the hottest call, is
written out on its own (its parameters kept these by ``tests/unit/test_api_parity.py``;
why: ``bench/FINDINGS.md``); `Timers.schedule` takes its operation's steps itself on a
prefix of one shard (``_schedule_one``).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

import redis

from timers.model.cron import CatchUp, Recurrence, recurrence
from timers.model.encoding import Args
from timers.model.history import HistoryRecord, MinuteStats
from timers.ops.listings import Stats
from timers.ops.operations import (
    Failure,
    Operation,
    Operations,
    PendingTimer,
    RetrySummary,
    TimerSpec,
    TimerStatus,
)
from timers.producer.base import Producer
from timers.producer.loops import warn_if_blocking_a_loop
from timers.producer.task_check import tasks_of
from timers.producer.transport import run_sync
from timers.store import connect
from timers.store.connect import URL_ENV, ScriptConnection, configured_url, sync_client
from timers.store.server_errors import out_of_memory, translate

__all__ = ["URL_ENV", "Timers", "configured_url"]


T = TypeVar("T")


class Timers(Producer[redis.Redis | redis.RedisCluster]):
    """Schedule, change and inspect timers over a sync redis-py client.

    ``redis`` is a URL, a ``redis.Redis`` the app already manages, or None for
    ``$TIMERS_REDIS_URL`` (default ``redis://localhost:6379/0``). A client made from a URL
    shares at most ``max_connections`` connections (default 50) among its callers' threads;
    a call that finds them all busy waits for one (see `timers.store.connect.POOL_WAIT`).
    ``group``: of the timers it schedules without one (default ``$TIMERS_GROUP`` or
    ``default``). ``shards``: how many shards the prefix is split into if this client uses
    it first (default ``$TIMERS_SHARDS``, else one per primary on a cluster, 1 on one
    server); see `timers.ops.shards`. ``strict``: refuse to write into a server whose
    eviction policy may evict pending timers (``allkeys-*``) rather than warn once; see
    `timers.store.eviction`. ``strict_tasks``: refuse to schedule a task no live
    listener announces (while any serves its group) rather than warn once; see
    `timers.producer.task_check`.

    ``replicas=n``: each write (schedule, schedule_many, reschedule, cancel) returns only
    once ``n`` replicas have it, waiting up to ``replicas_timeout`` seconds (default 1), in
    the same round trip (``WAIT``; with ``replicas_fsync=True`` also ``WAITAOF``, on disk,
    where the server has it); else it raises [`NotReplicated`][timers.exceptions.NotReplicated],
    naming the ids it wrote (the write stands on the primary). Each of those methods takes
    ``replicas`` and ``replicas_timeout`` for one call. See `timers.ops.replication`.
    """

    warn_in_event_loop = True
    """Warn when called on a running event loop's thread (off for in-memory servers)."""

    def _connect(self, redis_: str | redis.Redis | redis.RedisCluster | None,
                 max_connections: int | None) -> redis.Redis | redis.RedisCluster:
        if isinstance(redis_, redis.Redis | redis.RedisCluster):
            return redis_
        return sync_client(redis_, max_connections)

    def _kept_connection(self) -> ScriptConnection | None:
        return ScriptConnection.of(self.redis) if self._owns_client else None

    def run(self, operation: Operation[T]) -> T:
        """Drive one operation of `Operations` to its result.

        A write Redis refuses for want of memory is raised inside the operation as
        [`ServerOutOfMemory`][timers.exceptions.ServerOutOfMemory]; any other redis-py error is
        raised as a [`TimersError`][timers.exceptions.TimersError] (see
        `timers.store.server_errors`), the redis-py error as its cause."""
        if self.warn_in_event_loop:
            warn_if_blocking_a_loop()
        if connect.in_memory_server is not None:
            connect.refuse_outside_test_server(self.redis, "this Timers")
        try:
            request = next(operation)
            while True:
                try:
                    reply = run_sync(self.redis, self._scripts, request)
                except redis.exceptions.RedisError as exc:
                    request = self._failed(operation, exc)
                    continue
                request = operation.send(reply)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _write(self, operation: Operation[T],
               tasks: builtins.list[tuple[str, str]] | None = None) -> T:
        """Run an operation that writes, after its checks and those of ``tasks`` (`_checks`)."""
        if tasks or not self.first_write.clear:  # (else nothing to check)
            self._check(tasks)
        return self.run(operation)

    def _check(self, tasks: builtins.list[tuple[str, str]] | None) -> None:
        """Make the reads of the checks before a write (`Producer._checks`)."""
        for read in self._checks(tasks):
            if read is None:
                self.first_write.read_sync(self.redis)
            else:
                self.run(read)

    def schedule(
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
        """Run ``task`` (``"module.function"`` under the tasks package) later; returns the id.

        ``args``: a list (positional), a dict (keyword) or None, as JSON. Give exactly one
        of ``in_`` (seconds or timedelta, measured on the Redis clock) or ``at`` (aware
        datetime). With ``id``, a pending timer with that id is replaced atomically.
        With ``max_lateness`` (seconds), a run that would start later than that after the
        due time is recorded as missed instead of run. Flow control: ``group`` (default:
        the client's) picks the listeners that run it, ``key`` is a concurrency key and
        ``priority`` (-1000 to 1000) orders timers waiting for the same slot.
        ``replicas`` and ``replicas_timeout`` override the client's (``replicas=0``: do
        not wait for this one). On [`AsyncTimers`][timers.producer.async_client.AsyncTimers],
        calls in flight at once share round trips (see `timers.producer.coalesce`), and with
        ``replicas`` their ``WAIT`` too.
        """
        spec = TimerSpec(task, args, in_, at, id, max_lateness, group, key, priority)
        wanted = self.replicas.for_call(replicas, replicas_timeout)
        if not self.first_write.clear or self._unasked(spec):
            self._check(tasks_of([spec], self.ops.group))
        one = self.ops.single
        if one is None or wanted is not None:
            return self.run(self.ops.schedule(spec, replication=wanted))
        return self._schedule_one(one, spec)

    def _schedule_one(self, ops: Operations, spec: TimerSpec) -> str:
        """``run(ops.schedule(spec))`` on a prefix of one shard, the operation's steps
        (:meth:`Operations.schedule_one`, :meth:`Operations.taken`) taken in turn without
        driving its generator, nor building the request ``run_sync`` would carry: the
        hottest call, it saves a good share of its client CPU (figures: bench/FINDINGS.md,
        "A schedule's client CPU per timer"). Its errors are those ``run`` raises."""
        if self.warn_in_event_loop:
            warn_if_blocking_a_loop()
        if connect.in_memory_server is not None:
            connect.refuse_outside_test_server(self.redis, "this Timers")
        prepared = ops.prepare(spec)
        script = self._scripts["schedule"]
        while True:
            call = ops.schedule_one(prepared)
            try:  # (a lone script call: what run_sync sends for it)
                reply = script(keys=call.keys, args=call.args)
            except redis.exceptions.OutOfMemoryError as exc:
                error = out_of_memory(exc)
                error.written = []
                raise error from exc
            except redis.exceptions.RedisError as exc:
                raise translate(exc, self.redis) from exc
            again = ops.taken(prepared, reply)
            if again is None:
                return prepared.timer_id
            prepared = again

    def schedule_many(
        self, specs: Iterable[TimerSpec | Mapping[str, Any]], *,
        replicas: int | None = None, replicas_timeout: float | None = None,
    ) -> builtins.list[str]:
        """Schedule many timers in one round trip; returns their ids in order.

        All or nothing: an invalid timer, or a server out of memory
        ([`ServerOutOfMemory`][timers.exceptions.ServerOutOfMemory]), fails the whole call with
        nothing written. With ``replicas``, too few replicas in time raise
        [`NotReplicated`][timers.exceptions.NotReplicated] once every timer is written, naming the
        ids not confirmed."""
        specs = builtins.list(specs)
        return self._write(self.ops.schedule_many(
            specs, replication=self.replicas.for_call(replicas, replicas_timeout)),
            tasks_of(specs, self.ops.group))

    def reschedule(
        self, id: str, *, in_: float | timedelta | None = None, at: datetime | None = None,
        replicas: int | None = None, replicas_timeout: float | None = None,
    ) -> bool:
        """Move a pending timer to a new due time. False if it is not pending."""
        return self._write(self.ops.reschedule(
            id, in_, at, self.replicas.for_call(replicas, replicas_timeout)))

    def cancel(self, id: str, *, replicas: int | None = None,
               replicas_timeout: float | None = None) -> bool:
        """True if the timer was pending: it will now never fire."""
        return self.run(self.ops.cancel(
            id, self.replicas.for_call(replicas, replicas_timeout)))

    def get(self, id: str) -> PendingTimer | None:
        """The pending timer with this id, or None."""
        return self.run(self.ops.get(id))

    def status(self, id: str) -> TimerStatus:
        """Where the timer is: pending, waiting (on a key, a rate, a group or a retry),
        running (where), completed, skipped, dead, cancelled, or unknown (never existed
        or ended longer ago than the history keeps); see
        [`TimerStatus`][timers.ops.status.TimerStatus]."""
        return self.run(self.ops.status(id))

    def history(self, task: str | None = None, since: float | None = None,
                failed: bool = False, limit: int = 100) -> builtins.list[HistoryRecord]:
        """Ended timers (completed, skipped, dead, cancelled), newest end first: of
        ``task`` only, ended at or after ``since`` (epoch seconds), only dead ones
        (``failed``); at most ``limit``. The newest end of each id, kept as long as the
        listeners' history retention says."""
        return self.run(self.ops.history(task, since, failed, limit))

    def series(self, task: str | None = None, minutes: int = 60) -> builtins.list[MinuteStats]:
        """Per minute of the last ``minutes`` (at most 1440), oldest first, the current
        minute last: runs, failures, lateness and duration p50/p99 of ``task`` (None: every
        task summed); zeros for a minute without runs."""
        return self.run(self.ops.series(task, minutes))

    def tasks_seen(self) -> builtins.list[str]:
        """The tasks with a series: runs of them ended in the last 24 h."""
        return self.run(self.ops.tasks_seen())

    def list(self, limit: int = 100, group: str | None = None,
             key: str | None = None) -> builtins.list[PendingTimer]:
        """Pending timers (waiting ones too), soonest first: of every group, or of
        ``group``; with ``key``, those waiting for that concurrency key, then the rest
        that name it."""
        return self.run(self.ops.list_pending(limit, group, key))

    def failed(self, limit: int = 100) -> builtins.list[Failure]:
        """Failed and refused timers, most recent first."""
        return self.run(self.ops.list_failed(limit))

    def stats(self) -> Stats:
        """Counts over every shard: pending (waiting ones too), running, failed, the
        counters (fired, reruns, …), and per group, key and rate limit what waits."""
        return self.run(self.ops.stats())

    def get_failure(self, id: str) -> Failure | None:
        """The latest failure record of a timer id (or a ``:…`` rejected key)."""
        return self.run(self.ops.get_failure(id))

    def get_failures(self, id: str) -> builtins.list[Failure]:
        """Every failure record of a timer id (one per dead timer), most recent first."""
        return self.run(self.ops.get_failures(id))

    def retry_failure(self, failure: Failure, *, replace: bool = False) -> str:
        """Schedule a failed timer again, due now; returns its id. Raises
        [`TimerAlreadyPending`][timers.exceptions.TimerAlreadyPending] if its id is pending again,
        unless ``replace``."""
        return self._write(self.ops.retry_failure(failure, replace))

    def retry_all_failures(self, *, replace: bool = False) -> RetrySummary:
        """Retry every failed timer; skips (and counts) ids pending again and rejected keys."""
        return self._write(self.ops.retry_all_failures(replace))

    def purge_failures(self, older_than: float | None = None) -> int:
        """Delete failure records older than ``older_than`` seconds (all if None)."""
        ms = None if older_than is None else round(older_than * 1000)
        return self.run(self.ops.purge_failures(ms))

    def listeners(self) -> builtins.list[dict[str, Any]]:
        """The live listeners, from their heartbeats."""
        return self.run(self.ops.listeners())

    # -- recurring timers (see timers.model.cron) -------------------------------------------

    def every(
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
        [`schedule`][timers.producer.client.Timers.schedule] (``group`` None: this client's).
        """
        spec = recurrence(name, task, args, cron=cron, interval=interval, tz=tz,
                          catch_up=catch_up, max_lateness=max_lateness, overlap=overlap,
                          max_args_bytes=self.ops.max_args_bytes,
                          group=self.ops.group if group is None else group, key=key,
                          priority=priority)
        return self._write(self.ops.every(spec))

    def unschedule_recurring(self, name: str) -> bool:
        """Delete a recurrence and its pending occurrence; False if there was none."""
        return self.run(self.ops.unschedule_recurring(name))

    def pause(self, name: str) -> bool:
        """Stop a recurrence until [`resume`][timers.producer.client.Timers.resume]; False if there
        is none by that name."""
        return self.run(self.ops.pause(name))

    def resume(self, name: str) -> bool:
        """Schedule a paused recurrence again, from now; False if there is none."""
        return self._write(self.ops.resume(name))

    def get_recurrence(self, name: str) -> Recurrence | None:
        """The recurrence called ``name`` (its definition, state and next run), or None."""
        return self.run(self.ops.get_recurrence(name))

    def recurrences(self) -> builtins.list[Recurrence]:
        """Every recurrence, by name."""
        return self.run(self.ops.recurrences())

    def close(self) -> None:
        """Close the client's connections, if timers made the client (from a URL)."""
        if self._owns_client:
            self.redis.close()

    def __enter__(self) -> Timers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
