"""The producer's operations over the shards of a prefix (see :mod:`timers.ops.shards`).

:class:`ShardedOperations` has the API of :class:`timers.ops.operations.Operations`: what names
a timer (or a recurrence) goes to that one's shard, in the round trips one shard takes;
views (``list``, ``stats``, ``failed``, ``listeners``, recurrences) read every shard in
the same round trips as one shard would (:func:`gather` sends the shards' reads as one
pipeline) and merge them. The layout is read once, by the first operation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from timers.exceptions import InvalidTimer, NotReplicated, ServerOutOfMemory
from timers.model.cron import Recurrence
from timers.model.encoding import DEFAULT_MAX_ARGS_BYTES, Record, escape_id
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.history import HistoryRecord, MinuteSlot, MinuteStats, TimerState
from timers.model.keys import Keyspace, configured_prefix
from timers.model.run_record import record_head, record_option
from timers.model.wire import Option
from timers.ops.base import Call, Operation, Request
from timers.ops.failures import Failure, RetrySummary
from timers.ops.history import merge_slots
from timers.ops.operations import (
    Operations,
    PendingTimer,
    Prepared,
    Stats,
    TimerSpec,
    TimerStatus,
)
from timers.ops.replication import Replication
from timers.ops.shard_views import merge_stats, unique_listeners
from timers.ops.shards import (
    ShardLayout,
    configured_shards,
    id_in_shard,
    read_layout,
    shard_of,
    shard_of_key,
)
from timers.store.cluster import is_cluster, keyspace_for

if TYPE_CHECKING:  # the dashboard's and top's reads: imported where used, so a producer
    # command (timers schedule) loads none of them
    from timers.ops import tasks
    from timers.ops.snapshot import FleetSnapshot

T = TypeVar("T")


def gather(operations: Sequence[Operation[T]]) -> Operation[list[T]]:
    """Run operations side by side, each step's requests sent as one round trip (one at
    a time when a request must be atomic: a transaction cannot span shards)."""
    results: list[Any] = [None] * len(operations)
    current: dict[int, Request] = {}
    for index, operation in enumerate(operations):
        _advance(operation, index, None, current, results)
    while current:
        batches = ([[i] for i in current] if any(c.atomic for r in current.values() for c in r)
                   else [list(current)])
        for indexes in batches:
            replies = yield [call for i in indexes for call in current[i]]
            start = 0
            for i in indexes:
                request = current.pop(i)
                part, start = replies[start:start + len(request)], start + len(request)
                _advance(operations[i], i, part, current, results)
    return results


def _advance(operation: Operation[Any], index: int, reply: list[Any] | None,
             current: dict[int, Request], results: list[Any]) -> None:
    try:
        current[index] = next(operation) if reply is None else operation.send(reply)
    except StopIteration as done:
        results[index] = done.value


def declared_limit(record: str) -> str | None:
    """The name whose shard holds the limit a timer's task declares, when this process
    knows the declaration (the task registered by name, ``@timers.task(name=...)``): its
    rate's name, else its key (:meth:`TaskPolicy.limit_name`); None otherwise, for a task
    of another group than the timer's (it moves to its group first), or when the key
    function fails (the listener reports it)."""
    from timers.model.policy import registered_policy  # (only a sharded prefix asks)

    task, options = record_head(record)
    policy = registered_policy(task)
    if policy is None or not policy.flow_limited:
        return None
    group = (record_option(record, Option.GROUP) if options else None) or DEFAULT_GROUP
    if policy.group is not None and policy.group != group:
        return None
    try:
        return policy.limit_name(task, Record.decode(record).args)
    except Exception:
        return None


def placed(item: Prepared, count: int) -> Prepared:
    """``item`` with an id in the shard of its concurrency key, if it has one (the
    placement rule of :mod:`timers.ops.shards`): a generated id is drawn again until it falls
    there (every one, in turn, so a batch's ids still sort in its order); an id the
    producer chose that does not fall there is an :class:`InvalidTimer`. Without a key,
    a timer whose task's declared limit this process knows (:func:`declared_limit`) gets a
    generated id in its limit's shard; an id the producer chose stays in its own shard
    (the timer moves at its first claim)."""
    if count == 1:
        return item
    if item.route is None:
        name = None if item.replace else declared_limit(item.record)
        if name is None:
            return item
        fresh = id_in_shard(shard_of_key(name, count), count)
        return item._replace(timer_id=fresh, escaped=escape_id(fresh))
    shard = shard_of_key(item.route, count)
    if item.replace and shard_of(item.timer_id, count) == shard:
        return item
    if item.replace:
        raise InvalidTimer(
            f"timer id {item.timer_id!r} with key {item.route!r}: on {count} shards a keyed "
            f"timer lives in its key's shard, and its id must say so: put the key in "
            f"braces in the id (id={item.timer_id + '{' + item.route + '}'!r}), or let "
            f"timers make the id")
    fresh = id_in_shard(shard, count)
    return item._replace(timer_id=fresh, escaped=escape_id(fresh))


class ShardedOperations:
    """:class:`Operations` over every shard of a prefix."""

    def __init__(self, home: Keyspace, prefix: str, *, cluster: bool, shards: int | None,
                 max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
                 group: str = DEFAULT_GROUP) -> None:
        self.home, self.prefix, self.cluster, self.asked = home, prefix, cluster, shards
        self.max_args_bytes = max_args_bytes
        self.template = Operations(home, max_args_bytes, group)
        """Validates and encodes timers (that needs no shard)."""
        self.group = self.template.group
        self.layout: ShardLayout | None = None
        self._shards: list[Operations] = []
        self._single: Operations | None = None
        """The only shard's operations, once the layout says there is one: a timer's
        operations go there straight (no routing, no merging)."""

    @property
    def single(self) -> Operations | None:
        """The operations of the prefix's only shard, once the layout read says it has one
        (else None: several shards, or the layout not read yet)."""
        return self._single

    def shards(self) -> Operation[list[Operations]]:
        """The operations of each shard, reading the layout on first use."""
        if self.layout is None:
            layout = yield from read_layout(self.home, self.prefix, self.cluster, self.asked)
            self._shards = [Operations(k, self.max_args_bytes, self.group,
                                       (i, layout.count))
                            for i, k in enumerate(layout.keyspaces)]
            self.layout = layout
            self._single = self._shards[0] if len(self._shards) == 1 else None
        return self._shards

    def _of(self, name: str) -> Operation[Operations]:
        shards = yield from self.shards()
        return shards[shard_of(name, len(shards))]

    def _each(self, call: Callable[[Operations], Operation[T]]) -> Operation[list[T]]:
        """``call`` on the operations of every shard, at once (one round trip)."""
        shards = yield from self.shards()
        return (yield from gather([call(s) for s in shards]))

    def _routed(self, name: str, call: Callable[[Operations], Operation[T]]) -> Operation[T]:
        """``call`` on the operations of the shard of ``name`` (a timer id or recurrence)."""
        return (yield from call((yield from self._of(name))))

    # -- timers ---------------------------------------------------------------------

    def prepare(self, spec: TimerSpec | Mapping[str, Any],
                options: Mapping[str, str] | None = None) -> Prepared:
        return self.template.prepare(spec, options)

    def write(self, prepared: list[Prepared],
              replication: Replication | None = None) -> Operation[list[str]]:
        """Send prepared timers, a round trip per shard they fall in; their ids in order
        (:meth:`_write`; on one shard, that shard's :meth:`Operations.write` straight)."""
        if self._single is not None:
            return self._single.write(prepared, replication)
        return self._write(prepared, replication)

    def _write(self, prepared: list[Prepared],
               replication: Replication | None = None) -> Operation[list[str]]:
        """Send prepared timers, a round trip per shard they fall in; their ids in order.
        On a full server the error's ``written`` lists every id written before it. With
        ``replication`` each shard's round trip waits for that shard's replicas; every
        shard is written before a :class:`NotReplicated` names the ids of the shards
        whose replicas fell short."""
        shards = yield from self.shards()
        prepared = [placed(item, len(shards)) for item in prepared]
        by_shard: dict[int, list[int]] = defaultdict(list)
        for index, item in enumerate(prepared):
            by_shard[shard_of(item.timer_id, len(shards))].append(index)
        ids = [p.timer_id for p in prepared]
        written: list[str] = []
        short: NotReplicated | None = None
        for shard, indexes in sorted(by_shard.items()):
            try:
                got = yield from shards[shard].write([prepared[i] for i in indexes],
                                                     replication)
            except ServerOutOfMemory as exc:
                exc.written = written + list(exc.written or [])
                raise
            except NotReplicated as exc:
                got = [ids[i] for i in indexes]  # (an id replaced after a collision of
                # generated ids is in the error's timer_ids, not here)
                short = exc if short is None else short
                if short is not exc:
                    short.timer_ids += exc.timer_ids
            for index, timer_id in zip(indexes, got, strict=True):
                ids[index] = timer_id
            written += got
        if short is not None and replication is not None and len(by_shard) > 1:
            raise replication.error((short.acked, short.fsynced), short.timer_ids,
                                    "exist on the primaries" if len(short.timer_ids) > 1
                                    else "exists on its primary") from None
        if short is not None:
            raise short
        return ids

    def schedule_many(self, specs: Iterable[TimerSpec | Mapping[str, Any]],
                      options: Mapping[str, str] | None = None,
                      replication: Replication | None = None) -> Operation[list[str]]:
        if self._single is not None:  # one shard: what write() does, without its routing
            return self._single.schedule_many(specs, options, replication)
        return self._schedule_many(specs, options, replication)

    def _schedule_many(self, specs: Iterable[TimerSpec | Mapping[str, Any]],
                       options: Mapping[str, str] | None,
                       replication: Replication | None) -> Operation[list[str]]:
        return (yield from self._write(self.template.prepare_all(specs, options), replication))

    def schedule(self, spec: TimerSpec, options: Mapping[str, str] | None = None,
                 replication: Replication | None = None) -> Operation[str]:
        if self._single is not None:
            return self._single.schedule(spec, options, replication)
        return self._schedule(spec, options, replication)

    def _schedule(self, spec: TimerSpec, options: Mapping[str, str] | None,
                  replication: Replication | None) -> Operation[str]:
        ids = yield from self._write([self.prepare(spec, options)], replication)
        return ids[0]

    def _found(self, timer_id: str, call: Callable[[Operations], Operation[T]],
               found: Callable[[T], bool], one_at_a_time: bool = False) -> Operation[T]:
        """``call`` on the shard of ``timer_id``; when it does not find the timer there, on
        every other shard at once (one round trip more): a timer whose task declares a
        limit moved to its limit's shard at its first claim (:mod:`timers.listener.flow.placer`).
        The first shard's answer that found it, else the id's own shard's.
        ``one_at_a_time``: a shard per round trip (a write that waits for its shard's
        replicas: its ``WAIT`` must go to that shard's primary, with its write alone)."""
        shards = yield from self.shards()
        home = shard_of(timer_id, len(shards))
        result = yield from call(shards[home])
        if found(result) or len(shards) == 1:
            return result
        others = [s for i, s in enumerate(shards) if i != home]
        if one_at_a_time:
            for shard in others:
                other = yield from call(shard)
                if found(other):
                    return other
            return result
        answers = yield from gather([call(s) for s in others])
        return next((other for other in answers if found(other)), result)

    def reschedule(self, timer_id: str, in_: float | timedelta | None = None,
                   at: datetime | None = None,
                   replication: Replication | None = None) -> Operation[bool]:
        return (yield from self._found(
            timer_id, lambda s: s.reschedule(timer_id, in_, at, replication), bool,
            one_at_a_time=replication is not None))

    def cancel(self, timer_id: str,
               replication: Replication | None = None) -> Operation[bool]:
        return (yield from self._found(
            timer_id, lambda s: s.cancel(timer_id, replication), bool,
            one_at_a_time=replication is not None))

    def get(self, timer_id: str) -> Operation[PendingTimer | None]:
        return (yield from self._found(timer_id, lambda s: s.get(timer_id),
                                       lambda t: t is not None))

    def status(self, timer_id: str) -> Operation[TimerStatus]:
        return (yield from self._found(timer_id, lambda s: s.status(timer_id),
                                       lambda t: t.state is not TimerState.UNKNOWN))

    # -- history and series -----------------------------------------------------------

    def history(self, task: str | None = None, since: float | None = None,
                failed: bool = False, limit: int = 100) -> Operation[list[HistoryRecord]]:
        """Every shard's newest ends, newest first."""
        parts = yield from self._each(lambda s: s.history(task, since, failed, limit))
        merged = sorted((r for part in parts for r in part), key=lambda r: r.ended,
                        reverse=True)
        return merged[:max(limit, 0)]

    def series(self, task: str | None = None, minutes: int = 60) -> Operation[list[MinuteStats]]:
        """Per minute, every shard's runs summed and their histograms merged."""
        parts = yield from self._each(lambda s: s.series_slots(task, minutes))
        return [slot.stats() for slot in _same_minutes(parts)]

    def tasks_seen(self) -> Operation[list[str]]:
        parts = yield from self._each(Operations.tasks_seen)
        return sorted({task for part in parts for task in part})

    # -- views ------------------------------------------------------------------------

    def list_pending(self, limit: int = 100, group: str | None = None,
                     key: str | None = None) -> Operation[list[PendingTimer]]:
        parts = yield from self._each(lambda s: s.list_pending(limit, group, key))
        if len(parts) == 1:
            return parts[0]
        return sorted((t for part in parts for t in part), key=lambda t: t.due)[:max(limit, 0)]

    def stats(self) -> Operation[Stats]:
        parts = yield from self._each(Operations.stats)
        return parts[0] if len(parts) == 1 else merge_stats(parts)

    def listeners(self) -> Operation[list[dict[str, Any]]]:
        """Each live listener once (a listener heartbeats in every shard)."""
        return unique_listeners((yield from self._each(Operations.listeners)))

    def list_failed(self, limit: int = 100) -> Operation[list[Failure]]:
        parts = yield from self._each(lambda s: s.list_failed(limit))
        return _latest(parts)[:max(limit, 0)]

    def get_failures(self, timer_id: str) -> Operation[list[Failure]]:
        """A timer's failures are in its shard; a failure id (``…:…``) may be in any."""
        shards = yield from self.shards()
        if ":" not in timer_id or len(shards) == 1:
            return (yield from self._found(timer_id, lambda s: s.get_failures(timer_id),
                                           bool))
        parts = yield from gather([s.get_failures(timer_id) for s in shards])
        return _latest(parts)

    def get_failure(self, timer_id: str) -> Operation[Failure | None]:
        found = yield from self.get_failures(timer_id)
        return found[0] if found else None

    def retry_failure(self, failure: Failure, replace: bool = False) -> Operation[str]:
        """In the shard of the timer id; in the shard that holds the failure record when
        that is another (a timer that moved to its limit's shard and died there: it is
        scheduled again there, and found by id as any moved timer is)."""
        shards = yield from self.shards()
        home = shard_of(failure.timer_id or "", len(shards))
        if len(shards) > 1:
            held = yield [Call(command=("HEXISTS", s.keys.failure_records, failure.failure_id))
                          for s in shards]
            holding = [i for i, found in enumerate(held) if int(found)]
            if holding and home not in holding:
                home = holding[0]
        return (yield from shards[home].retry_failure(failure, replace))

    def retry_all_failures(self, replace: bool = False,
                           runnable_only: bool = True) -> Operation[RetrySummary]:
        retried = pending = not_retryable = unrunnable = 0
        example: str | None = None
        for shard in (yield from self.shards()):
            part = yield from shard.retry_all_failures(replace, runnable_only)
            retried += part.retried
            pending += part.pending
            not_retryable += part.not_retryable
            unrunnable += part.unrunnable
            example = example or part.unrunnable_example
        return RetrySummary(retried, pending, not_retryable, unrunnable, example)

    def purge_failures(self, older_than_ms: int | None = None) -> Operation[int]:
        removed = 0
        for shard in (yield from self.shards()):
            removed += yield from shard.purge_failures(older_than_ms)
        return removed

    # -- the dashboard's reads -------------------------------------------------------

    def snapshot(self) -> Operation[FleetSnapshot]:
        """The fleet's figures (``timers top``, metrics, the dashboard), every shard's as
        one."""
        from timers.ops.shard_views import merge_snapshots
        from timers.ops.snapshot import read_snapshot

        parts = yield from self._each(lambda s: read_snapshot(s.keys))
        return parts[0] if len(parts) == 1 else merge_snapshots(parts)

    def browse_page(self, offset: int, limit: int, group: str | None = None,
                    priority: int | None = None) -> Operation[list[PendingTimer]]:
        """Timers ``offset`` to ``offset + limit`` of every group and priority (or of
        ``group``, of ``priority``), held-back ones too, soonest first over every shard."""
        from timers.ops import browse

        shards = yield from self.shards()
        if len(shards) == 1:
            return (yield from browse.page(shards[0].keys, offset, limit, group, priority))
        parts = yield from gather([browse.page(s.keys, 0, offset + limit, group, priority)
                                   for s in shards])
        return _soonest(parts)[offset:offset + limit]

    def search_id_prefix(self, prefix: str,
                         limit: int) -> Operation[tuple[list[PendingTimer], bool]]:
        from timers.ops import browse

        parts = yield from self._each(lambda s: browse.search_id_prefix(s.keys, prefix, limit))
        return _soonest([p[0] for p in parts])[:limit], all(p[1] for p in parts)

    def filter_task(self, task: str, limit: int) -> Operation[list[PendingTimer]]:
        from timers.ops import browse

        parts = yield from self._each(lambda s: browse.filter_task(s.keys, task, limit))
        return _soonest(parts)[:limit]

    def task_flow(self, task: str) -> Operation[list[tasks.TaskFlow]]:
        """The limits ``task``'s runs meet and its runs under way, per shard."""
        from timers.ops import tasks

        return (yield from self._each(lambda s: tasks.task_flow(s.keys, task)))

    def announced_tasks(self) -> Operation[set[str]]:
        """The task paths the live listeners announce, over every shard."""
        from timers.ops import tasks

        parts = yield from self._each(lambda s: tasks.announced_tasks(s.keys))
        return set().union(*parts)

    def running_runs(self) -> Operation[list[tasks.Running]]:
        """Every run under way, over every shard."""
        from timers.ops import tasks

        parts = yield from self._each(lambda s: tasks.running_runs(s.keys))
        return [r for part in parts for r in part]

    # -- recurrences ------------------------------------------------------------------

    def every(self, spec: Recurrence) -> Operation[Recurrence]:
        return (yield from self._routed(spec.name, lambda s: s.every(spec)))

    def unschedule_recurring(self, name: str) -> Operation[bool]:
        return (yield from self._routed(name, lambda s: s.unschedule_recurring(name)))

    def pause(self, name: str) -> Operation[bool]:
        return (yield from self._routed(name, lambda s: s.pause(name)))

    def resume(self, name: str) -> Operation[bool]:
        return (yield from self._routed(name, lambda s: s.resume(name)))

    def get_recurrence(self, name: str) -> Operation[Recurrence | None]:
        return (yield from self._routed(name, lambda s: s.get_recurrence(name)))

    def recurrences(self) -> Operation[list[Recurrence]]:
        parts = yield from self._each(Operations.recurrences)
        return sorted((r for part in parts for r in part), key=lambda r: r.name)


def operations_for(client: object, prefix: str | None, shards: int | None,
                   max_args_bytes: int, group: str) -> ShardedOperations:
    """The operations of a client: the configured prefix (hash-tagged on a cluster) and
    shard count (``shards``, else ``$TIMERS_SHARDS``, else the prefix's)."""
    return ShardedOperations(keyspace_for(client, prefix), configured_prefix(prefix),
                             cluster=is_cluster(client), shards=configured_shards(shards),
                             max_args_bytes=max_args_bytes, group=group)


def _same_minutes(parts: Sequence[list[MinuteSlot]]) -> list[MinuteSlot]:
    """Shards' slots merged minute by minute (a shard read a minute later than another
    has its window shifted by one: aligned on the latest minute)."""
    last = max(part[-1].minute for part in parts)
    count = len(parts[0])
    wanted = range(last - count + 1, last + 1)
    aligned = []
    for part in parts:
        by_minute = {slot.minute: slot for slot in part}
        aligned.append([by_minute.get(m, MinuteSlot(m)) for m in wanted])
    return merge_slots(aligned)


def _soonest(parts: Iterable[list[PendingTimer]]) -> list[PendingTimer]:
    return sorted((t for part in parts for t in part), key=lambda t: t.due)


def _latest(parts: Iterable[list[Failure]]) -> list[Failure]:
    return sorted((f for part in parts for f in part), key=lambda f: f.at, reverse=True)
