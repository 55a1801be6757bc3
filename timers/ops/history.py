"""Reads of the run history and the per-task series (written by the listeners'
``finish.lua`` and by ``cancel.lua``; see ``timers/store/lua/history.lua``).

``history`` pages through the history zset newest first (``ZREVRANGEBYSCORE`` then
``HMGET``, O(log n + page)); ``series`` reads one ring slot per task and minute
(``HMGET``), so a day of one task is one round trip of 1,440 fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import as_text, unescape_id
from timers.model.keys import Keyspace
from timers.model.wire import SERIES_MINUTES, HistoryRecord, MinuteSlot, MinuteStats
from timers.ops.base import Call, Operation, pairs

HISTORY_PAGE = 1000
"""History records read per round trip while a filter (task, failed) skips some."""
HISTORY_SCAN = 100_000
"""At most this many records are looked at per shard for one filtered ``history`` call."""


def redis_ms(reply: Sequence[Any]) -> int:
    """Redis ``TIME`` as ms."""
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


def _record(field: Any, value: Any) -> HistoryRecord | None:
    if value is None:
        return None
    try:
        timer_id = unescape_id(as_text(field))
    except MalformedTimerKey:
        timer_id = as_text(field)
    return HistoryRecord.decode(timer_id, as_text(value))


def merge_slots(parts: Sequence[Sequence[MinuteSlot]]) -> list[MinuteSlot]:
    """Minute slots of several tasks or shards, minute by minute (same minutes each)."""
    if not parts:
        return []
    out = [MinuteSlot(slot.minute) for slot in parts[0]]
    for part in parts:
        for total, slot in zip(out, part, strict=True):
            total.add(slot)
    return out


class HistoryOperations:
    """The history and series reads of one keyspace (a mixin of
    :class:`timers.ops.operations.Operations`)."""

    keys: Keyspace

    def history(self, task: str | None = None, since: float | None = None,
                failed: bool = False, limit: int = 100) -> Operation[list[HistoryRecord]]:
        """Ended timers, newest end first: of ``task`` only, ended at or after ``since``
        (epoch seconds), dead only (``failed``); at most ``limit``."""
        if limit <= 0:
            return []
        low = "-inf" if since is None else str(round(since * 1000))
        filtered = task is not None or failed
        page = max(limit, HISTORY_PAGE) if filtered else limit
        out: list[HistoryRecord] = []
        offset = 0
        while len(out) < limit and offset < HISTORY_SCAN:
            (ids,) = yield [Call(command=("ZREVRANGEBYSCORE", self.keys.history, "+inf", low,
                                          "LIMIT", offset, page))]
            if not ids:
                break
            (values,) = yield [Call(command=("HMGET", self.keys.history_records, *ids))]
            for field, value in zip(ids, values, strict=True):
                record = _record(field, value)
                if (record is not None and (task is None or record.task == task)
                        and (not failed or record.failed)):
                    out.append(record)
            if len(ids) < page:
                break
            offset += page
        return out[:limit]

    def history_of(self, timer_id_escaped: str) -> Operation[HistoryRecord | None]:
        """The newest end of one timer (escaped id), if the history keeps it."""
        (value,) = yield [Call(command=("HGET", self.keys.history_records, timer_id_escaped))]
        return _record(timer_id_escaped, value)

    def tasks_seen(self) -> Operation[list[str]]:
        """The tasks with a series (runs ended in the last 24 h), by name."""
        now, seen = yield [Call(command=("TIME",)),
                           Call(command=("HGETALL", self.keys.series_tasks))]
        first = redis_ms(now) // 60_000 - SERIES_MINUTES + 1
        items = seen.items() if isinstance(seen, dict) else pairs(seen)
        return sorted(as_text(task) for task, minute in items if int(minute) >= first)

    def series_slots(self, task: str | None = None,
                     minutes: int = 60) -> Operation[list[MinuteSlot]]:
        """One :class:`MinuteSlot` per minute of the last ``minutes`` (1 to 1440; the
        current minute last), of ``task`` or every task summed; empty minutes are zeros."""
        minutes = max(1, min(SERIES_MINUTES, minutes))
        tasks = (yield from self.tasks_seen()) if task is None else [task]
        (now,) = yield [Call(command=("TIME",))]
        last = redis_ms(now) // 60_000
        wanted = list(range(last - minutes + 1, last + 1))
        if not tasks:
            return [MinuteSlot(m) for m in wanted]
        replies = yield [Call(command=("HMGET", self.keys.series,
                                       *(f"{t}|{m % SERIES_MINUTES}" for m in wanted)))
                         for t in tasks]
        parts = []
        for values in replies:
            slots = []
            for minute, value in zip(wanted, values, strict=True):
                slot = None if value is None else MinuteSlot.decode(as_text(value))
                slots.append(slot if slot is not None and slot.minute == minute
                             else MinuteSlot(minute))
            parts.append(slots)
        return merge_slots(parts)

    def series(self, task: str | None = None, minutes: int = 60) -> Operation[list[MinuteStats]]:
        """:meth:`series_slots` as :class:`MinuteStats` (percentiles from the histograms)."""
        slots = yield from self.series_slots(task, minutes)
        return [slot.stats() for slot in slots]
