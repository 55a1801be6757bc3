"""The producer's operations over the shards of a prefix (see :mod:`timers.ops.shards`).

:class:`ShardedOperations` has the API of :class:`timers.ops.operations.Operations`: what names
a timer (or a recurrence) goes to that one's shard, in the round trips one shard takes;
views (``list``, ``stats``, ``failed``, ``listeners``, recurrences) read every shard in
the same round trips as one shard would (:func:`timers.ops.gather.gather` sends the shards'
reads as one pipeline) and merge them (:mod:`timers.ops.shard_views`). A new timer's shard
is :func:`timers.ops.placement.placed`'s. The layout is read once, by the first operation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from timers.exceptions import NotReplicated, ServerOutOfMemory
from timers.model.cron import Recurrence
from timers.model.encoding import DEFAULT_MAX_ARGS_BYTES
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.history import HistoryRecord, MinuteStats, TimerState
from timers.model.keys import Keyspace, configured_prefix
from timers.ops.base import Call, Operation
from timers.ops.failures import Failure, RetrySummary
from timers.ops.gather import gather
from timers.ops.listings import Stats
from timers.ops.operations import (
    Operations,
    PendingTimer,
    Prepared,
    TimerSpec,
    TimerStatus,
)
from timers.ops.placement import placed
from timers.ops.replication import Replication
from timers.ops.shard_views import (
    latest,
    merge_stats,
    same_minutes,
    soonest,
    unique_listeners,
)
from timers.ops.shards import ShardLayout, configured_shards, read_layout, shard_of
from timers.store.cluster import is_cluster, keyspace_for

if TYPE_CHECKING:  # the dashboard's and top's reads: imported where used, so a producer
    # command (timers schedule) loads none of them
    from timers.ops import tasks
    from timers.ops.snapshot import FleetSnapshot

T = TypeVar("T")


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
        return [slot.stats() for slot in same_minutes(parts)]

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
        return latest(parts)[:max(limit, 0)]

    def get_failures(self, timer_id: str) -> Operation[list[Failure]]:
        """A timer's failures are in its shard; a failure id (``…:…``) may be in any."""
        shards = yield from self.shards()
        if ":" not in timer_id or len(shards) == 1:
            return (yield from self._found(timer_id, lambda s: s.get_failures(timer_id),
                                           bool))
        parts = yield from gather([s.get_failures(timer_id) for s in shards])
        return latest(parts)

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
        return soonest(parts)[offset:offset + limit]

    def search_id_prefix(self, prefix: str,
                         limit: int) -> Operation[tuple[list[PendingTimer], bool]]:
        from timers.ops import browse

        parts = yield from self._each(lambda s: browse.search_id_prefix(s.keys, prefix, limit))
        return soonest([p[0] for p in parts])[:limit], all(p[1] for p in parts)

    def filter_task(self, task: str, limit: int) -> Operation[list[PendingTimer]]:
        from timers.ops import browse

        parts = yield from self._each(lambda s: browse.filter_task(s.keys, task, limit))
        return soonest(parts)[:limit]

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
