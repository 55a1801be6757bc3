"""Pages of pending timers for the dashboard, each read with bounded work however many
timers are pending: a page of every due index and flow queue merged (the first
:data:`MERGE_DEPTH` of each, ``ZRANGE`` by rank), a search by id prefix (a bounded ``HSCAN``
of the records), a filter by task over a bounded window of the indexes.
"""

from __future__ import annotations

from typing import Any

from timers.exceptions import MalformedTimerKey
from timers.model.encoding import Record, as_text, escape_id
from timers.model.keys import Keyspace
from timers.ops.base import Call, Operation
from timers.ops.flow_views import (
    due_indexes,
    find_many,
    group_of,
    parked_entries,
    priority_of,
)
from timers.ops.pending import PendingTimer, pending_of

SCAN_COUNT = 1000
SEARCH_SCANS = 10
"""HSCAN calls a search by id prefix makes at most (about 10,000 records looked at): past
that it shows what it found and says the search stopped early."""
FILTER_WINDOW = 5000
"""Timers at the head of each index a task filter looks through at most."""
MERGE_DEPTH = 2500
"""Timers from the head of each due index and flow queue a merged page reaches at most."""


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped, for ``MATCH``."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def sources(keys: Keyspace, group: str | None = None) -> Operation[list[str]]:
    """Every due index of ``group`` (None: of every group) and every flow queue with a
    timer waiting in it: where a pending timer is."""
    queues, parked = yield [Call(command=("SMEMBERS", keys.queues)),
                            Call(command=("HGETALL", keys.parked))]  # (an admin read)
    return due_indexes(keys, queues, group) + sorted(
        {p.queue(keys) for p in parked_entries(parked).values() if p.waiting})


def page(keys: Keyspace, offset: int, limit: int, group: str | None = None,
         priority: int | None = None) -> Operation[list[PendingTimer]]:
    """Timers ``offset`` to ``offset + limit`` of every group and priority (or of
    ``group``, of ``priority``), those held back by a key, a rate or a group included,
    soonest first. ValueError past :data:`MERGE_DEPTH`."""
    if offset + limit > MERGE_DEPTH:
        raise ValueError(f"a page reaches the first {MERGE_DEPTH:,} timers at most: "
                         f"choose a group or search")
    where = yield from sources(keys, group)
    heads = yield [Call(command=("ZRANGE", source, 0, offset + limit - 1))
                   for source in where]
    found = yield from find_many(keys, (as_text(i) for head in heads for i in head))
    chosen = [f for f in found if group in (None, group_of(f.record))
              and priority in (None, priority_of(f.record))]
    chosen.sort(key=lambda f: f.due_ms)
    return [pending_of(f) for f in chosen[offset:offset + limit]]


def search_id_prefix(keys: Keyspace, prefix: str,
                     limit: int) -> Operation[tuple[list[PendingTimer], bool]]:
    """Pending timers whose id starts with ``prefix``, soonest first, and whether the
    search covered every record (False: it stopped after :data:`SEARCH_SCANS` scans)."""
    pattern = _glob(escape_id(prefix)) + "*"
    cursor: Any = 0
    ids: list[str] = []
    for _ in range(SEARCH_SCANS):
        (reply,) = yield [Call(command=("HSCAN", keys.records, cursor, "MATCH", pattern,
                                        "COUNT", SCAN_COUNT))]
        cursor, entries = reply[0], reply[1]
        ids += [as_text(k) for k in (entries if isinstance(entries, dict) else entries[0::2])]
        if int(cursor) == 0 or len(ids) >= limit:
            break
    found = yield from find_many(keys, ids)
    timers = sorted((pending_of(f) for f in found), key=lambda t: t.due)[:limit]
    return timers, int(cursor) == 0


def filter_task(keys: Keyspace, task: str, limit: int) -> Operation[list[PendingTimer]]:
    """Pending timers of ``task`` among the first :data:`FILTER_WINDOW` of each due index
    and flow queue, soonest first."""
    where = yield from sources(keys)
    heads = yield [Call(command=("ZRANGE", source, 0, FILTER_WINDOW - 1)) for source in where]
    ids = list(dict.fromkeys(as_text(i) for head in heads for i in head))
    records = (yield [Call(command=("HMGET", keys.records, *ids))])[0] if ids else []
    chosen = [i for i, value in zip(ids, records, strict=True) if _task(value) == task]
    found = yield from find_many(keys, chosen)
    return [pending_of(f) for f in sorted(found, key=lambda f: f.due_ms)[:limit]]


def _task(value: Any) -> str | None:
    try:
        return None if value is None else Record.decode(as_text(value)).task
    except MalformedTimerKey:
        return None
