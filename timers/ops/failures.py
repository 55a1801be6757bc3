"""Admin operations on failure records: list, read by timer id, retry, purge.

A dead timer's record has the failure id ``<escaped id>:<run token>`` (one per dead timer)
and is listed in the failure index, so the records of one timer id are one ZRANGEBYLEX
away; a rejected event's record has the id ``<escaped id>`` or ``:<digest>``.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from timers.exceptions import InvalidTimer, MalformedTimerKey, TimerAlreadyPending
from timers.model.encoding import as_text, check_id, escape_id
from timers.model.keys import DEFAULT_GROUP, Keyspace
from timers.model.wire import FailureRecord, Option
from timers.ops.base import Call, Operation, ms_to_datetime, pairs
from timers.store.script_calls import ScriptCalls

FAILURE_PAGE = 500
"""Failure records read per round trip when paging through all of them."""


@dataclass(frozen=True)
class Failure:
    """A timer that failed or was refused, kept where ``timers failed`` lists it."""

    failure_id: str
    at: datetime
    data: dict[str, Any]
    raw: str = ""

    @property
    def record(self) -> FailureRecord:
        """The record's fields, typed (``data`` holds them as stored)."""
        return FailureRecord.from_dict(self.data)

    @property
    def timer_id(self) -> str | None:
        return self.record.id


@dataclass(frozen=True)
class RetrySummary:
    """What [`Timers.retry_all_failures`][timers.producer.client.Timers.retry_all_failures] did."""

    retried: int
    """Failed timers scheduled again."""
    pending: int
    """Skipped: a timer with the same id is pending again (``replace`` overwrites it)."""
    not_retryable: int
    """Skipped: rejected event keys, which name no timer to run."""
    unrunnable: int = 0
    """Skipped: no live listener can run their task in their group (while some listener
    is live: `timers.ops.fleet.FleetView.may_run`)."""
    unrunnable_example: str | None = None
    """One of those: ``<id> (<task>, group <g>)``."""


class FailureOperations:
    """The failure-record operations of :class:`timers.ops.operations.Operations`."""

    keys: Keyspace
    calls: ScriptCalls

    @abstractmethod
    def _retry_call(self, task: str, args: Any, timer_id: str, replace: bool,
                    options: Mapping[str, str]) -> Call:
        """The schedule call that puts a failed timer back, due now, with the group,
        priority, concurrency key and max lateness it had (``options``): "r" to replace a
        pending timer with that id, else "k" to keep it."""

    def list_failed(self, limit: int = 100) -> Operation[list[Failure]]:
        """Failed and refused timers, most recent first."""
        if limit <= 0:
            return []
        (head,) = yield [Call(command=("ZRANGE", self.keys.failures, 0, limit - 1, "REV",
                                       "WITHSCORES"))]
        entries = pairs(head)
        if not entries:
            return []
        (records,) = yield [
            Call(command=("HMGET", self.keys.failure_records, *[i for i, _ in entries]))
        ]
        return [_failure(as_text(failure_id), raw, score)
                for (failure_id, score), raw in zip(entries, records, strict=True)
                if raw is not None]

    def get_failures(self, timer_id: str) -> Operation[list[Failure]]:
        """Every failure record of a timer id, most recent first: one per dead timer with
        that id, and a rejected event's. ``timer_id`` may also be a failure id itself
        (``:…`` of a rejected key, or ``<id>:<token>`` as ``failed list`` shows it)."""
        escaped = escape_id(check_id(timer_id))
        (dead,) = yield [Call(command=("ZRANGEBYLEX", self.keys.failure_index,
                                       f"[{escaped}:", f"({escaped};"))]
        candidates = [escaped, *(as_text(d) for d in dead)]
        if ":" in timer_id:
            candidates.append(timer_id)  # a failure id as listed
        found = yield from self._read_failures(list(dict.fromkeys(candidates)))
        return sorted(found, key=lambda f: f.at, reverse=True)

    def get_failure(self, timer_id: str) -> Operation[Failure | None]:
        """The most recent failure record of a timer id (see :meth:`get_failures`)."""
        found = yield from self.get_failures(timer_id)
        return found[0] if found else None

    def _read_failures(self, failure_ids: Sequence[str]) -> Operation[list[Failure]]:
        if not failure_ids:
            return []
        replies = yield [
            Call(command=("HMGET", self.keys.failure_records, *failure_ids)),
            *(Call(command=("ZSCORE", self.keys.failures, f)) for f in failure_ids),
        ]
        out = []
        for failure_id, raw, score in zip(failure_ids, replies[0], replies[1:], strict=True):
            if raw is not None:
                out.append(_failure(failure_id, raw, score))
        return out

    def retry_failure(self, failure: Failure, replace: bool = False) -> Operation[str]:
        """Schedule a failed timer again, due now, attempts reset; then forget the failure.

        A timer pending again under the same id is never overwritten: that raises
        :class:`TimerAlreadyPending` and keeps the record, unless ``replace``.
        Scheduling comes first, so a crash between the two steps leaves a duplicate
        record, never a lost timer; the record is kept if the timer failed anew meanwhile.
        """
        record = failure.record
        task, timer_id = record.task, record.id
        if task is None or timer_id is None:
            raise InvalidTimer(
                f"{failure.failure_id} was a rejected event key, not a timer: nothing to retry"
            )
        (reply,) = yield [self._retry_call(task, record.args, timer_id, replace,
                                           record.options or {})]
        if reply[1] is None:
            raise TimerAlreadyPending(
                f"timer {timer_id} is pending again: not retried (replace to overwrite it)",
                timer_id,
            )
        yield [self._forget(failure.failure_id, failure.raw)]
        return timer_id

    def retry_all_failures(self, replace: bool = False,
                           runnable_only: bool = True) -> Operation[RetrySummary]:
        """Retry every failure record older than now, page by page, oldest first.

        With ``runnable_only``, a timer whose task no live listener can run in its group
        is left as it is (it would only be refused again), counted in the summary; when no
        listener is live, every one is retried (one started later may run it).
        Records written while this runs (a retried timer failing anew included) are left
        for the next call, so this always ends."""
        from timers.ops.fleet import FleetView, read_fleet  # (retries alone read the fleet)

        fleet = (yield from read_fleet(self.keys)) if runnable_only else FleetView()
        (now,) = yield [Call(command=("TIME",))]
        until = int(now[0]) * 1000 + int(now[1]) // 1000
        retried = pending = not_retryable = unrunnable = 0
        example: str | None = None
        # a cursor, not a rank: (score, the members of that score already read); another
        # process's removals (a purge, the retention's trim, a second retry) shift ranks,
        # and paging by rank skipped records that stayed
        low: float | None = None
        seen: set[str] = set()
        while True:
            (reply,) = yield [Call(command=(
                "ZRANGEBYSCORE", self.keys.failures, "-inf" if low is None else repr(low),
                until, "WITHSCORES", "LIMIT", 0, FAILURE_PAGE + len(seen)))]
            page = [(member, score) for member, score in _scored(reply)
                    if not (score == low and member in seen)][:FAILURE_PAGE]
            if not page:
                return RetrySummary(retried, pending, not_retryable, unrunnable, example)
            for member, score in page:
                if score != low:
                    low, seen = score, set()
                seen.add(member)
            for failure in (yield from self._read_failures([m for m, _ in page])):
                if failure.timer_id is None or failure.record.task is None:
                    not_retryable += 1
                    continue
                group = failure_group(failure)
                if not fleet.may_run(failure.record.task, group):
                    unrunnable += 1
                    example = example or (f"{failure.timer_id} ({failure.record.task}, "
                                          f"group {group})")
                    continue
                try:
                    yield from self.retry_failure(failure, replace)
                    retried += 1
                except TimerAlreadyPending:
                    pending += 1
                except InvalidTimer:  # its stored record does not make a timer any more
                    not_retryable += 1

    def _forget(self, failure_id: str, raw: str) -> Call:
        return Call.of(self.calls.forget(failure_id, raw))

    def purge_failures(self, older_than_ms: int | None = None) -> Operation[int]:
        """Delete failure records (older than ``older_than_ms`` if given); returns how many."""
        removed = 0
        while True:
            (now,) = yield [Call(command=("TIME",))]
            cutoff = "+inf" if older_than_ms is None else (
                int(now[0]) * 1000 + int(now[1]) // 1000 - older_than_ms
            )
            (ids,) = yield [Call(command=("ZRANGEBYSCORE", self.keys.failures, "-inf", cutoff,
                                          "LIMIT", 0, 1000))]
            if not ids:
                return removed
            yield [
                Call(command=("ZREM", self.keys.failures, *ids), atomic=True),
                Call(command=("HDEL", self.keys.failure_records, *ids)),
                Call(command=("ZREM", self.keys.failure_index, *ids)),
            ]
            removed += len(ids)


def _scored(reply: Any) -> list[tuple[str, float]]:
    """(member, score) pairs of a ``WITHSCORES`` reply: flat, or paired by the client."""
    items = list(reply or [])
    if items and isinstance(items[0], (list, tuple)):
        return [(as_text(member), float(score)) for member, score in items]
    return [(as_text(items[i]), float(items[i + 1])) for i in range(0, len(items), 2)]


def failure_group(failure: Failure) -> str:
    """The group a dead timer was in (and a retry schedules it in)."""
    return (failure.record.options or {}).get(Option.GROUP) or DEFAULT_GROUP


def _failure(failure_id: str, raw: Any, score: Any) -> Failure:
    try:
        data = json.loads(as_text(raw))
    except (ValueError, MalformedTimerKey):
        data = {"error": "unreadable failure record"}
    if not isinstance(data, dict):
        data = {"error": "unreadable failure record"}
    at = ms_to_datetime(float(score)) if score is not None else ms_to_datetime(0)
    return Failure(failure_id, at, data, as_text(raw))


