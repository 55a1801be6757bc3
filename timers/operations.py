"""What every producer and admin operation sends to Redis and how it reads the reply.

Each operation is a generator that yields a :class:`Request` (one round trip: a script call
or a pipeline) and receives its reply, so the logic exists once and the sync and asyncio
clients (:mod:`timers.client`) only carry the I/O. Nothing here touches the network, which
is also what makes it testable without a server.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from timers.cron import Recurrence, check_name, decode_recurrences, read_state
from timers.cron.schedule import from_ms, to_ms
from timers.due import DueSpec, due_spec, seconds
from timers.encoding import (
    DEFAULT_MAX_ARGS_BYTES,
    Args,
    Record,
    as_text,
    check_id,
    check_user_id,
    escape_id,
    unescape_id,
)
from timers.exceptions import (
    InvalidDueTime,
    InvalidTimer,
    MalformedTimerKey,
    ServerOutOfMemory,
    TimersError,
)
from timers.failure_ops import Failure, FailureOperations, RetrySummary
from timers.keys import Keyspace
from timers.ops_base import Call, Operation, Request, ms_to_datetime, pairs
from timers.scripts import NewTimer, ScriptCalls

__all__ = [
    "Call", "Failure", "Operation", "Operations", "PendingTimer", "Request", "RetrySummary",
    "Stats", "TimerSpec", "new_timer_id",
]
SCHEDULE_CHUNK = 500
"""Timers per schedule script call in :meth:`Operations.schedule_many`."""
DECLARE_ATTEMPTS = 20
"""Reads and writes of a recurrence declaration before giving up on a state that keeps
changing (each retry means another process changed it in between)."""


@dataclass(frozen=True)
class TimerSpec:
    """One timer for :meth:`Timers.schedule_many`; the fields mean what they mean in schedule."""

    task: str
    args: Args = None
    in_: float | timedelta | None = None
    at: datetime | None = None
    id: str | None = None
    max_lateness: float | timedelta | None = None


@dataclass(frozen=True)
class PendingTimer:
    """A timer waiting for its due time."""

    id: str
    task: str
    args: Args
    due: datetime
    attempts: int = 0

    def seconds_left(self, now: datetime) -> float:
        return (self.due - now).total_seconds()


@dataclass(frozen=True)
class Stats:
    pending: int
    running: int
    failed: int
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def fired(self) -> int:
        return self.counters.get("fired", 0)


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


def new_timer_id() -> str:
    """A random id: 12 URL-safe characters, 72 bits."""
    return secrets.token_urlsafe(9)


@dataclass(frozen=True)
class _Prepared:
    timer_id: str
    escaped: str
    record: str
    due: DueSpec
    replace: bool


class Operations(FailureOperations):
    """Builds requests for one keyspace and reads their replies."""

    def __init__(self, keyspace: Keyspace, max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> None:
        self.keys = keyspace
        self.calls = ScriptCalls(keyspace)
        self.max_args_bytes = max_args_bytes

    # -- schedule ---------------------------------------------------------------------

    def _prepare(
        self, spec: TimerSpec, options: Mapping[str, str] | None = None, *, retry: bool = False
    ) -> _Prepared:
        """Validate and encode one timer. ``retry``: a failed timer put back under its own
        id, which may be an occurrence's (a user's new timer may not take that form)."""
        opts = dict(options or {})
        if spec.max_lateness is not None:
            limit = seconds(spec.max_lateness, "max_lateness")
            if limit < 0 or limit > 1e12:
                raise InvalidDueTime("max_lateness must be 0 or more seconds")
            opts["ml"] = str(round(limit * 1000))
        record = Record(spec.task, spec.args, opts).encode(self.max_args_bytes)
        due = due_spec(spec.in_, spec.at)
        if spec.id is None:
            timer_id, replace = new_timer_id(), False
        else:
            timer_id, replace = (check_id if retry else check_user_id)(spec.id), True
        return _Prepared(timer_id, escape_id(timer_id), record, due, replace)

    def _schedule_call(self, batch: Sequence[_Prepared], how: str | None = None) -> Call:
        timers = [NewTimer(p.escaped, p.record, p.due[0], p.due[1],
                           how or ("r" if p.replace else "n")) for p in batch]
        return Call.of(self.calls.schedule(timers), atomic=True)

    def _retry_call(self, task: str, args: Any, timer_id: str, replace: bool) -> Call:
        prepared = self._prepare(TimerSpec(task, args, in_=0, id=timer_id), retry=True)
        return self._schedule_call([prepared], "r" if replace else "k")

    def schedule_many(
        self,
        specs: Iterable[TimerSpec | Mapping[str, Any]],
        options: Mapping[str, str] | None = None,
    ) -> Operation[list[str]]:
        """Schedule timers in one round trip; returns their ids in order.

        All or nothing: every timer is validated before anything is sent, and the script
        calls (one per :data:`SCHEDULE_CHUNK` timers) run in one MULTI/EXEC, which a full
        server refuses as a whole (:class:`ServerOutOfMemory`, nothing written). A
        generated id that happens to be pending already is replaced by a fresh one and
        sent again, never overwritten; should that second round trip fail, the error's
        ``written`` lists the ids of the first.
        """
        prepared = [self._prepare_nth(index, s, options) for index, s in enumerate(specs)]
        return (yield from self._write(prepared))

    def _prepare_nth(
        self, index: int, item: TimerSpec | Mapping[str, Any], options: Mapping[str, str] | None
    ) -> _Prepared:
        """:meth:`_prepare` for the ``index``-th timer of a batch: an error names it (its
        index, and its id if it has one), as the same class of error."""
        try:
            return self._prepare(_coerce_spec(item), options)
        except InvalidTimer as exc:
            raise type(exc)(f"timer {index}{_id_part(item)}: {exc}") from None

    def _write(self, prepared: list[_Prepared]) -> Operation[list[str]]:
        """Send prepared timers (see :meth:`schedule_many`)."""
        todo = list(range(len(prepared)))
        written: list[str] = []
        while todo:
            chunks = [todo[i : i + SCHEDULE_CHUNK] for i in range(0, len(todo), SCHEDULE_CHUNK)]
            try:
                replies = yield [self._schedule_call([prepared[i] for i in c]) for c in chunks]
            except ServerOutOfMemory as exc:
                exc.written = written
                raise
            retry: list[int] = []
            for chunk, reply in zip(chunks, replies, strict=True):
                for index, due in zip(chunk, reply[1:], strict=True):
                    if due is None:
                        old = prepared[index]
                        fresh = new_timer_id()
                        prepared[index] = _Prepared(
                            fresh, escape_id(fresh), old.record, old.due, old.replace
                        )
                        retry.append(index)
                    else:
                        written.append(prepared[index].timer_id)
            todo = retry
        return [p.timer_id for p in prepared]

    def schedule(
        self, spec: TimerSpec, options: Mapping[str, str] | None = None
    ) -> Operation[str]:
        ids = yield from self._write([self._prepare(_coerce_spec(spec), options)])
        return ids[0]

    # -- change and read one timer ----------------------------------------------------

    def reschedule(
        self,
        timer_id: str,
        in_: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> Operation[bool]:
        escaped = escape_id(check_id(timer_id))
        mode, ms = due_spec(in_, at)
        (reply,) = yield [Call.of(self.calls.reschedule(escaped, mode, ms))]
        return reply is not None

    def cancel(self, timer_id: str) -> Operation[bool]:
        escaped = escape_id(check_id(timer_id))
        (reply,) = yield [Call.of(self.calls.cancel(escaped))]
        return int(reply) == 1

    def get(self, timer_id: str) -> Operation[PendingTimer | None]:
        escaped = escape_id(check_id(timer_id))
        record, score = yield [
            Call(command=("HGET", self.keys.records, escaped)),
            Call(command=("ZSCORE", self.keys.due, escaped)),
        ]
        if record is None or score is None:
            return None
        return _pending(timer_id, as_text(record), float(score))

    # -- listings ---------------------------------------------------------------------

    def list_pending(self, limit: int = 100) -> Operation[list[PendingTimer]]:
        """Pending timers, soonest first."""
        if limit <= 0:
            return []
        (head,) = yield [Call(command=("ZRANGE", self.keys.due, 0, limit - 1, "WITHSCORES"))]
        entries = pairs(head)
        if not entries:
            return []
        (records,) = yield [Call(command=("HMGET", self.keys.records, *[i for i, _ in entries]))]
        out = []
        for (escaped, score), record in zip(entries, records, strict=True):
            if record is None:
                continue  # fired or cancelled between the two reads
            try:
                out.append(_pending(unescape_id(as_text(escaped)), as_text(record), float(score)))
            except MalformedTimerKey:
                continue
        return out

    def stats(self) -> Operation[Stats]:
        pending, running, failed, counters = yield [
            Call(command=("ZCARD", self.keys.due)),
            Call(command=("ZCARD", self.keys.running)),
            Call(command=("ZCARD", self.keys.failures)),
            Call(command=("HGETALL", self.keys.stats)),
        ]
        items = counters.items() if isinstance(counters, dict) else pairs(counters)
        return Stats(
            int(pending),
            int(running),
            int(failed),
            {as_text(k): int(v) for k, v in items},
        )

    def listeners(self) -> Operation[list[dict[str, Any]]]:
        """The live listeners, from their heartbeats."""
        now, entries, infos = yield [
            Call(command=("TIME",)),
            Call(command=("ZRANGE", self.keys.listeners, 0, -1, "WITHSCORES")),
            Call(command=("HGETALL", self.keys.listener_info)),
        ]
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        info_items = infos.items() if isinstance(infos, dict) else pairs(infos)
        info = {as_text(k): as_text(v) for k, v in info_items}
        out = []
        for listener_id, deadline in pairs(entries):
            name = as_text(listener_id)
            if float(deadline) <= now_ms or name not in info:
                continue
            try:
                out.append(json.loads(info[name]))
            except ValueError:
                continue
        return out


    # -- recurrences (see timers.cron) ------------------------------------------------

    def every(self, spec: Recurrence) -> Operation[Recurrence]:
        """Declare a recurrence, or change it in place; declaring it unchanged changes
        nothing (its pending occurrence included)."""
        definition = spec.definition(self.max_args_bytes)
        return (yield from self._declare(spec, definition, "keep"))

    def _declare(self, spec: Recurrence, definition: str, paused: str) -> Operation[Recurrence]:
        name_field = escape_id(spec.name)
        for _ in range(DECLARE_ATTEMPTS):
            now, stored, raw_state = yield [
                Call(command=("TIME",)),
                Call(command=("HGET", self.keys.recurrences, name_field)),
                Call(command=("HGET", self.keys.recurrence_states, name_field)),
            ]
            now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
            state = read_state(raw_state)
            anchor = now_ms
            if spec.interval is not None and state.anchor and stored is not None:
                with contextlib.suppress(MalformedTimerKey):
                    old = Recurrence.from_redis(spec.name, stored, None)
                    anchor = state.anchor if old.interval == spec.interval else now_ms
            schedule = spec.schedule(from_ms(anchor))
            version = state.version + 1
            # later than now, and than the last occurrence a listener may have taken
            due_if_withdrawn = to_ms(schedule.next_after(from_ms(max(now_ms, state.prev))))
            due_otherwise = to_ms(schedule.next_after(from_ms(max(now_ms, state.last))))
            _, record = spec.occurrence(version, due_otherwise, self.max_args_bytes)
            (reply,) = yield [Call.of(self.calls.cron_declare(
                name_field=name_field, definition=definition,
                read_state=as_text(raw_state) if raw_state is not None else "", paused=paused,
                version=version, anchor_ms=anchor if spec.interval is not None else 0,
                record=record, due_if_withdrawn=due_if_withdrawn, due_otherwise=due_otherwise,
            ))]
            result, version, due = (int(x) for x in reply)
            if result == -1:
                continue  # the state moved on between the read and the write: read again
            return replace(
                spec, version=version, next_due=None if due == -1 else from_ms(due),
                paused=state.paused if paused == "keep" else paused == "1",
                anchor=from_ms(anchor) if spec.interval is not None else None,
            )
        raise TimersError(f"recurrence {spec.name!r} kept changing while being declared")

    def unschedule_recurring(self, name: str) -> Operation[bool]:
        """Delete a recurrence and its pending occurrence; False if there was none."""
        (reply,) = yield [Call.of(self.calls.cron_remove(escape_id(check_name(name))))]
        return int(reply) == 1

    def pause(self, name: str) -> Operation[bool]:
        """Stop scheduling occurrences (the pending one is withdrawn); False if unknown."""
        (reply,) = yield [Call.of(self.calls.cron_pause(escape_id(check_name(name))))]
        return int(reply) != -1

    def resume(self, name: str) -> Operation[bool]:
        """Schedule a paused recurrence again from now (missed times are not caught up);
        False if unknown."""
        name_field = escape_id(check_name(name))
        stored, raw_state = yield [
            Call(command=("HGET", self.keys.recurrences, name_field)),
            Call(command=("HGET", self.keys.recurrence_states, name_field)),
        ]
        if stored is None:
            return False
        if raw_state is not None and not read_state(raw_state).paused:
            return True
        current = Recurrence.from_redis(name, stored, None)
        yield from self._declare(current, as_text(stored), "0")
        return True

    def get_recurrence(self, name: str) -> Operation[Recurrence | None]:
        """One recurrence as Redis holds it, or None."""
        name_field = escape_id(check_name(name))
        stored, raw_state = yield [
            Call(command=("HGET", self.keys.recurrences, name_field)),
            Call(command=("HGET", self.keys.recurrence_states, name_field)),
        ]
        if stored is None:
            return None
        pending = yield from self._pending({name_field: raw_state})
        return Recurrence.from_redis(name, stored, raw_state, pending.get(name_field, False))

    def recurrences(self) -> Operation[list[Recurrence]]:
        """Every recurrence, by name."""
        defs, states = yield [
            Call(command=("HGETALL", self.keys.recurrences)),
            Call(command=("HGETALL", self.keys.recurrence_states)),
        ]
        defs = dict(defs.items() if isinstance(defs, dict) else pairs(defs))
        states = dict(states.items() if isinstance(states, dict) else pairs(states))
        pending = yield from self._pending({as_text(k): v for k, v in states.items()})
        return decode_recurrences(defs, states, pending)

    def _pending(self, states: Mapping[str, Any]) -> Operation[dict[str, bool]]:
        """Whether each recurrence's latest occurrence is still waiting in the due index."""
        fields = [f for f, raw in states.items() if raw is not None]
        if not fields:
            return {}
        replies = yield [
            Call(command=("HEXISTS", self.keys.records,
                          f"{f}@{read_state(states[f]).last}")) for f in fields
        ]
        return {f: bool(int(r)) for f, r in zip(fields, replies, strict=True)}


def _pending(timer_id: str, record_text: str, due_ms: float) -> PendingTimer:
    record = Record.decode(record_text)
    return PendingTimer(
        id=timer_id,
        task=record.task,
        args=record.args,
        due=ms_to_datetime(due_ms),
        attempts=int(record.options.get("a", "0")),
    )
