"""Reads of the run history and the per-task series (written by the listeners'
``finish.lua`` and by ``cancel.lua``; see ``timers/store/lua/history.lua``).

``history`` pages through the history's batches newest first (``ZREVRANGEBYSCORE``, then
``HMGET`` of their ids in ``P|histb``, then of their records, keeping each record its
batch still names: O(log n + page) per page), and filtered (a task, the dead), through
that task's or the dead ends' index (escaped id -> end ms), the same way; ``series``
reads one ring slot per task and minute (``HMGET``), so a day of one task is one round
trip of 1,440 fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import as_text, unescape_id
from timers.model.history import (
    HISTORY_INDEXED,
    SERIES_MINUTES,
    HistoryRecord,
    MinuteSlot,
    MinuteStats,
    StoredHistory,
)
from timers.model.keys import Keyspace
from timers.ops.base import Call, Operation, pairs

HISTORY_PAGE = 1000
"""History records read per round trip while a filter (task, failed) skips some."""
HISTORY_SCAN = 100_000
"""At most this many records are looked at per shard for one filtered ``history`` call."""
BATCH_PAGE = 256
"""History batches read per round trip (each names one record or more)."""


def redis_ms(reply: Sequence[Any]) -> int:
    """Redis ``TIME`` as ms."""
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


def _timer_id(escaped: str) -> str:
    try:
        return unescape_id(escaped)
    except MalformedTimerKey:
        return escaped


def _stored(field: Any, value: Any) -> StoredHistory | None:
    if value is None:
        return None
    escaped = as_text(field)
    return StoredHistory.decode(_timer_id(escaped), as_text(value))


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
        (epoch seconds), dead only (``failed``); at most ``limit``. Filtered, from the
        index (the dead ends', else the task's: O(log n + page) per page), and the batches
        written before it and not indexed yet (past ``P|histix``) looked at one by one."""
        if limit <= 0:
            return []
        low = "-inf" if since is None else str(round(since * 1000))
        if task is None and not failed:
            return (yield from self._scan(low, limit, None))

        def wanted(record: HistoryRecord) -> bool:
            return (task is None or record.task == task) and (not failed or record.failed)

        found = yield from self._indexed(
            self.keys.history_failed if failed else self.keys.history_task(task or ""),
            low, limit, wanted)
        (cursor,) = yield [Call(command=("GET", self.keys.history_cursor))]
        if cursor is not None:
            cursor_ms = int(as_text(cursor))
            low = f"({cursor_ms}" if low == "-inf" or cursor_ms >= int(low) else low
        found += yield from self._scan(low, limit, wanted, unindexed=True)
        newest: dict[str, HistoryRecord] = {}
        for record in found:
            newest.setdefault(record.id, record)
        return sorted(newest.values(), key=lambda r: r.ended, reverse=True)[:limit]

    def _indexed(self, key: str, low: str, limit: int,
                 wanted: Callable[[HistoryRecord], bool]) -> Operation[list[HistoryRecord]]:
        """The records a history index (escaped id -> end ms) names, newest first, that
        ``wanted`` keeps (an entry whose id ended since under another task, or not dead,
        is passed over); at most ``limit``."""
        out: list[HistoryRecord] = []
        offset = 0
        while len(out) < limit and offset < HISTORY_SCAN:
            (ids,) = yield [Call(command=("ZREVRANGEBYSCORE", key, "+inf", low, "LIMIT",
                                          offset, HISTORY_PAGE))]
            if not ids:
                break
            escaped = [as_text(i) for i in ids]
            (values,) = yield [Call(command=("HMGET", self.keys.history_records, *escaped))]
            for one, value in zip(escaped, values, strict=True):
                stored = _stored(one, value)
                if stored is not None and stored.record is not None and wanted(stored.record):
                    out.append(stored.record)
            if len(ids) < HISTORY_PAGE:
                break
            offset += len(ids)
        return out[:limit]

    def _scan(self, low: str, limit: int, wanted: Callable[[HistoryRecord], bool] | None,
              unindexed: bool = False) -> Operation[list[HistoryRecord]]:
        """The records of the history's batches ended after ``low``, newest first, that
        ``wanted`` keeps (None: all); with ``unindexed``, of the batches written before the
        index only (an id not starting ``::``). At most ``limit``, of :data:`HISTORY_SCAN`
        looked at."""
        filtered = unindexed or wanted is not None
        out: list[HistoryRecord] = []
        seen: set[str] = set()  # an id twice in one batch (it ended twice in one call)
        offset = looked = 0
        while len(out) < limit and looked < HISTORY_SCAN:
            want = HISTORY_PAGE if filtered else limit - len(out)
            (members,) = yield [Call(command=("ZREVRANGEBYSCORE", self.keys.history, "+inf",
                                              low, "LIMIT", offset, min(want, BATCH_PAGE)))]
            if not members:
                break
            names = [as_text(m) for m in members]
            if unindexed:
                names = [m for m in names if not m.startswith(HISTORY_INDEXED)]
            entries = yield from self._entries(names)
            start = 0
            while start < len(entries) and len(out) < limit:
                chunk = entries[start:start + (HISTORY_PAGE if filtered else limit - len(out))]
                start += len(chunk)
                (values,) = yield [Call(command=("HMGET", self.keys.history_records,
                                                 *(escaped for _, escaped in chunk)))]
                for (member, escaped), value in zip(chunk, values, strict=True):
                    stored = _stored(escaped, value)
                    record = None if stored is None else stored.of(member)
                    if (record is not None and escaped not in seen
                            and (wanted is None or wanted(record))):
                        seen.add(escaped)
                        out.append(record)
            looked += max(start, len(members))
            if len(members) < min(want, BATCH_PAGE):
                break
            offset += len(members)
        return out[:limit]

    def _entries(self, members: list[str]) -> Operation[list[tuple[str, str]]]:
        """(batch id, escaped id) of each record the history index members (batch ids)
        name, in their order, from the batches' lists (``P|histb``)."""
        if not members:
            return []
        (texts,) = yield [Call(command=("HMGET", self.keys.history_batches, *members))]
        return [(member, escaped) for member, text in zip(members, texts, strict=True)
                if text is not None for escaped in as_text(text).split(":")]

    def tasks_seen(self) -> Operation[list[str]]:
        """The tasks with a series (runs ended in the last 24 h), by name."""
        now, seen = yield [Call(command=("TIME",)),
                           Call(command=("HGETALL", self.keys.series_tasks))]
        first = redis_ms(now) // 60_000 - SERIES_MINUTES + 1
        return sorted(as_text(task) for task, minute in pairs(seen) if int(minute) >= first)

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
