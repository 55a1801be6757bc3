"""What every producer and admin operation sends to Redis and how it reads the reply.

Each operation is a generator that yields a :class:`Request` (one round trip: a script call
or a pipeline) and receives its reply, so the logic exists once and the sync and asyncio
clients (:mod:`timers.producer.client`) only carry the I/O. Nothing here touches the network, which
is also what makes it testable without a server.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from timers.exceptions import (
    InvalidDueTime,
    InvalidTimer,
    MalformedTimerKey,
    ServerOutOfMemory,
)
from timers.model.due import DueSpec, due_spec, seconds
from timers.model.encoding import (
    DEFAULT_MAX_ARGS_BYTES,
    Args,
    check_id,
    check_user_id,
    encode_record,
    escape_id,
)
from timers.model.fast_init import fast_init
from timers.model.flow.names import DEFAULT_GROUP, check_group
from timers.model.flow.options import flow_options, read_flow
from timers.model.keys import Keyspace
from timers.model.timer_ids import new_timer_id
from timers.model.trace import traceparent
from timers.model.wire import (
    Option,
    ScheduleMode,
)
from timers.ops import flow_views as views
from timers.ops.base import Call, Operation, Request
from timers.ops.failures import Failure, FailureOperations, RetrySummary
from timers.ops.history import HistoryOperations
from timers.ops.listings import ListingOperations
from timers.ops.pending import PendingTimer, pending_of
from timers.ops.recurrences import RecurrenceOperations
from timers.ops.replication import Replication
from timers.ops.shards import id_in_shard
from timers.ops.status import StatusOperations, TimerStatus
from timers.store.script_calls import Invocation, ScriptCalls
from timers.store.script_rows import NewTimer

__all__ = [
    "Call", "Failure", "Operation", "Operations", "PendingTimer", "Request", "RetrySummary",
    "TimerSpec", "TimerStatus", "new_timer_id",
]
SCHEDULE_CHUNK = 500
"""Timers per schedule script call in :meth:`Operations.schedule_many`."""


@fast_init  # made by every schedule
@dataclass(frozen=True)
class TimerSpec:
    """One timer for [`Timers.schedule_many`][timers.producer.client.Timers.schedule_many]; the
    fields mean what they mean in schedule."""

    task: str
    args: Args | tuple[Any, ...] = None
    in_: float | timedelta | None = None
    at: datetime | None = None
    id: str | None = None
    max_lateness: float | timedelta | None = None
    group: str | None = None
    """The timer's group (None: the client's, see
    [`timers.Timers`][timers.producer.client.Timers])."""
    key: str | None = None
    """A concurrency key: the task's concurrency limit then holds per key."""
    priority: int = 0
    """-1000 to 1000: higher runs first among timers waiting for the same slot."""


def _coerce_spec(item: TimerSpec | Mapping[str, Any]) -> TimerSpec:
    if isinstance(item, TimerSpec):
        return item
    if isinstance(item, Mapping):
        try:
            return TimerSpec(**item)
        except TypeError as exc:
            raise InvalidTimer(f"bad timer spec {dict(item)!r}: {exc}") from None
    raise InvalidTimer(f"schedule_many takes TimerSpec or dict items, got {type(item).__name__}")


def _id_part(item: object) -> str:
    timer_id = item.get("id") if isinstance(item, Mapping) else getattr(item, "id", None)
    return "" if timer_id is None else f" (id {timer_id!r})"


class Prepared(NamedTuple):
    """One timer validated and encoded, ready to send: a named tuple, as a frozen
    dataclass is slower to make, once per timer of every schedule
    (figures: bench/FINDINGS.md, "A schedule's client CPU per timer")."""

    timer_id: str
    escaped: str
    record: str
    due: DueSpec
    replace: bool
    route: str | None = None
    """The concurrency key the producer gave: the timer lives in that key's shard
    (:mod:`timers.ops.shards`)."""


class Operations(FailureOperations, RecurrenceOperations, HistoryOperations,
                 StatusOperations, ListingOperations):
    """Builds requests for one keyspace and reads their replies."""

    def __init__(
        self,
        keyspace: Keyspace,
        max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
        group: str = DEFAULT_GROUP,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        self.keys = keyspace
        self.group = check_group(group)
        """The group of timers scheduled without one."""
        self._own_options = flow_options(self.group, None, 0)
        """The record options of a timer with no group, key or priority of its own."""
        self.calls = ScriptCalls(keyspace)
        self.max_args_bytes = max_args_bytes
        self.shard = shard
        """(this keyspace's shard, the prefix's shard count): a generated id made here
        falls in this shard."""

    # -- schedule ---------------------------------------------------------------------

    def _prepare(
        self, spec: TimerSpec, options: Mapping[str, str] | None = None, *, retry: bool = False
    ) -> Prepared:
        """Validate and encode one timer. ``retry``: a failed timer put back under its own
        id, which may be an occurrence's (a user's new timer may not take that form)."""
        if (spec.group is None and spec.key is None and type(spec.priority) is int
                and spec.priority == 0):  # most timers: the client's group, checked once
            opts = dict(self._own_options)
        else:
            group = self.group if spec.group is None else spec.group
            opts = flow_options(group, spec.key, spec.priority)
        if options:
            opts.update(options)
        if (parent := traceparent()) is not None:  # the span scheduling it (otel extra)
            opts[Option.TRACE] = parent
        if spec.max_lateness is not None:
            limit = seconds(spec.max_lateness, "max_lateness")
            if limit < 0 or limit > 1e12:
                raise InvalidDueTime("max_lateness must be 0 or more seconds")
            opts[Option.MAX_LATENESS] = str(round(limit * 1000))
        args = list(spec.args) if isinstance(spec.args, tuple) else spec.args
        record = encode_record(spec.task, args, opts, self.max_args_bytes)
        due = due_spec(spec.in_, spec.at)
        if spec.id is None:  # (a generated id has nothing to escape: see timer_ids.ALPHABET)
            timer_id = new_timer_id()
            return Prepared(timer_id, timer_id, record, due, False, spec.key)
        timer_id = (check_id if retry else check_user_id)(spec.id)
        return Prepared(timer_id, escape_id(timer_id), record, due, True, spec.key)

    def _schedule_call(self, batch: Sequence[Prepared], how: str | None = None) -> Call:
        timers = [NewTimer(p.escaped, p.record, p.due[0], p.due[1],
                           how or (ScheduleMode.REPLACE if p.replace else ScheduleMode.NEW))
                  for p in batch]
        return Call.of(self.calls.schedule(timers), atomic=True)

    def schedule_one(self, prepared: Prepared) -> Invocation:
        """The script call that writes one prepared timer (:meth:`schedule`'s; read its reply
        with :meth:`taken`)."""
        return self.calls.schedule_one(
            prepared.escaped, prepared.record, prepared.due[0], prepared.due[1],
            ScheduleMode.REPLACE if prepared.replace else ScheduleMode.NEW)

    def taken(self, prepared: Prepared, reply: Any) -> Prepared | None:
        """After :meth:`schedule_one`'s call of ``prepared`` replied ``reply``: None when it
        was written; else its generated id was pending already, nothing was written, and
        this is the timer with a fresh id, to send again."""
        if reply[1] is not None:
            return None
        fresh = id_in_shard(*self.shard, new_timer_id)
        return Prepared(fresh, escape_id(fresh), prepared.record, prepared.due,
                        prepared.replace, prepared.route)

    def _retry_call(self, task: str, args: Any, timer_id: str, replace: bool,
                    options: Mapping[str, str]) -> Call:
        # the timer's own group (absent: the default, not the retrying client's), key
        # and priority, each checked again as a schedule checks them
        try:
            flow = read_flow(options)
            late_ms = options.get(Option.MAX_LATENESS)
            max_lateness = None if late_ms is None else int(late_ms) / 1000
        except (MalformedTimerKey, ValueError) as exc:
            raise InvalidTimer(f"timer {timer_id}: its failure record's options do not "
                               f"read ({exc}): not retried") from None
        spec = TimerSpec(task, args, in_=0, id=timer_id, group=flow.group, key=flow.key,
                         priority=flow.priority, max_lateness=max_lateness)
        prepared = self._prepare(spec, retry=True)
        how = ScheduleMode.REPLACE if replace else ScheduleMode.KEEP
        return self._schedule_call([prepared], how)

    def schedule_many(
        self,
        specs: Iterable[TimerSpec | Mapping[str, Any]],
        options: Mapping[str, str] | None = None,
        replication: Replication | None = None,
    ) -> Operation[list[str]]:
        """Schedule timers in one round trip; returns their ids in order.

        All or nothing: every timer is validated before anything is sent, and the script
        calls (one per :data:`SCHEDULE_CHUNK` timers) run in one MULTI/EXEC, which a full
        server refuses as a whole (:class:`ServerOutOfMemory`, nothing written). A
        generated id that happens to be pending already is replaced by a fresh one and
        sent again, never overwritten; should that second round trip fail, the error's
        ``written`` lists the ids of the first. With ``replication``, each round trip
        ends with its ``WAIT`` (see :mod:`timers.ops.replication`): too few replicas raise
        :class:`NotReplicated` naming the ids written, once every timer is written.
        """
        return (yield from self._write(self.prepare_all(specs, options), replication))

    def _prepare_nth(
        self, index: int, item: TimerSpec | Mapping[str, Any], options: Mapping[str, str] | None
    ) -> Prepared:
        """:meth:`_prepare` for the ``index``-th timer of a batch: an error names it (its
        index, and its id if it has one), as the same class of error."""
        try:
            return self._prepare(_coerce_spec(item), options)
        except InvalidTimer as exc:
            raise type(exc)(f"timer {index}{_id_part(item)}: {exc}") from None

    def _write(self, prepared: list[Prepared],
               replication: Replication | None = None) -> Operation[list[str]]:
        """Send prepared timers (see :meth:`schedule_many`)."""
        todo = list(range(len(prepared)))
        written: list[str] = []
        waits = [] if replication is None else replication.calls()
        short: tuple[int, int | None] | None = None
        unconfirmed: list[str] = []
        while todo:
            chunks = [todo[i : i + SCHEDULE_CHUNK] for i in range(0, len(todo), SCHEDULE_CHUNK)]
            try:
                request = [self._schedule_call([prepared[i] for i in c]) for c in chunks]
                replies = yield request + waits if waits else request
            except ServerOutOfMemory as exc:
                exc.written = written
                raise
            before = len(written)
            retry: list[int] = []
            for chunk, reply in zip(chunks, replies[:len(chunks)], strict=True):
                for index, due in zip(chunk, reply[1:], strict=True):
                    if due is None:
                        old = prepared[index]
                        fresh = id_in_shard(*self.shard, new_timer_id)
                        prepared[index] = Prepared(
                            fresh, escape_id(fresh), old.record, old.due, old.replace,
                            old.route)
                        retry.append(index)
                    else:
                        written.append(prepared[index].timer_id)
            todo = retry
            if replication is not None:
                missing = replication.shortfall(replies[len(chunks):])
                if missing is not None:
                    short = missing if short is None else short
                    unconfirmed += written[before:]
        if replication is not None and short is not None:
            raise replication.error(short, unconfirmed, _exist(unconfirmed))
        return [p.timer_id for p in prepared]

    def prepare(self, spec: TimerSpec | Mapping[str, Any],
                options: Mapping[str, str] | None = None) -> Prepared:
        """Validate and encode one timer for :meth:`write` (errors are the caller's own)."""
        return self._prepare(_coerce_spec(spec), options)

    def prepare_all(self, specs: Iterable[TimerSpec | Mapping[str, Any]],
                    options: Mapping[str, str] | None = None) -> list[Prepared]:
        """:meth:`prepare` for a batch: an error names the timer (index, id)."""
        return [self._prepare_nth(index, s, options) for index, s in enumerate(specs)]

    def write(self, prepared: list[Prepared],
              replication: Replication | None = None) -> Operation[list[str]]:
        """Send timers :meth:`prepare` made, in one round trip (see :meth:`schedule_many`)."""
        return (yield from self._write(prepared, replication))

    def schedule(
        self, spec: TimerSpec, options: Mapping[str, str] | None = None,
        replication: Replication | None = None,
    ) -> Operation[str]:
        prepared = self._prepare(_coerce_spec(spec), options)
        if replication is not None:
            ids = yield from self._write([prepared], replication)
            return ids[0]
        while True:  # what _write does for one timer, in fewer steps (the common call)
            try:
                (reply,) = yield [Call.of(self.schedule_one(prepared), atomic=True)]
            except ServerOutOfMemory as exc:
                exc.written = []
                raise
            again = self.taken(prepared, reply)
            if again is None:
                return prepared.timer_id
            prepared = again

    # -- change and read one timer ----------------------------------------------------

    def reschedule(
        self,
        timer_id: str,
        in_: float | timedelta | None = None,
        at: datetime | None = None,
        replication: Replication | None = None,
    ) -> Operation[bool]:
        """Move a pending timer; with ``replication``, confirm the move on the replicas
        (:class:`NotReplicated` if it moved and too few have it)."""
        escaped = escape_id(check_id(timer_id))
        mode, ms = due_spec(in_, at)
        call = Call.of(self.calls.reschedule(escaped, mode, ms))
        if replication is None:
            (reply,) = yield [call]
            return reply is not None
        reply, *waits = yield [call, *replication.calls()]
        if reply is not None:
            replication.check(waits, [timer_id], "was moved on the primary")
        return reply is not None

    def cancel(self, timer_id: str, replication: Replication | None = None) -> Operation[bool]:
        """Cancel a pending timer; with ``replication``, confirm it on the replicas
        (:class:`NotReplicated` if it was cancelled and too few have that)."""
        escaped = escape_id(check_id(timer_id))
        call = Call.of(self.calls.cancel(escaped, f"{socket.gethostname()}:{os.getpid()}"))
        if replication is None:
            (reply,) = yield [call]
            return int(reply) == 1
        reply, *waits = yield [call, *replication.calls()]
        if int(reply) == 1:
            replication.check(waits, [timer_id], "was cancelled on the primary")
        return int(reply) == 1

    def get(self, timer_id: str) -> Operation[PendingTimer | None]:
        """The pending timer with this id, in whichever group, waiting or not."""
        found = yield from views.find_many(self.keys, [escape_id(check_id(timer_id))])
        return pending_of(found[0]) if found else None


def _exist(timer_ids: Sequence[str]) -> str:
    return "exists on the primary" if len(timer_ids) == 1 else "exist on the primary"
