"""Pages of pending timers for the dashboard, each read with bounded work however many
timers are pending: a page of a due index (``ZRANGE`` by rank), a search by id prefix (a
bounded ``HSCAN`` of the records), a filter by task over a bounded window of the index.
"""

from __future__ import annotations

from typing import Any

from timers.encoding import Record, as_text, escape_id
from timers.exceptions import MalformedTimerKey
from timers.flow.views import find_many
from timers.keys import DEFAULT_GROUP, Keyspace
from timers.operations import PendingTimer, pending_of
from timers.ops_base import Call, Operation

SCAN_COUNT = 1000
SEARCH_SCANS = 10
"""HSCAN calls a search by id prefix makes at most (about 10,000 records looked at): past
that it shows what it found and says the search stopped early."""
FILTER_WINDOW = 5000
"""Timers at the head of the index a task filter looks through at most."""


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped, for ``MATCH``."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def page(keys: Keyspace, offset: int, limit: int, group: str = DEFAULT_GROUP,
         priority: int = 0) -> Operation[list[PendingTimer]]:
    """Timers ``offset`` to ``offset + limit`` of one due index, soonest first."""
    (ids,) = yield [Call(command=("ZRANGE", keys.due_index(group, priority), offset,
                                  offset + limit - 1))]
    found = yield from find_many(keys, (as_text(i) for i in ids))
    return [pending_of(f) for f in found]


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


def filter_task(keys: Keyspace, task: str, limit: int,
                group: str = DEFAULT_GROUP) -> Operation[list[PendingTimer]]:
    """Pending timers of ``task`` among the first :data:`FILTER_WINDOW` of the index."""
    (entries,) = yield [Call(command=("ZRANGE", keys.due_index(group, 0), 0,
                                      FILTER_WINDOW - 1))]
    ids = [as_text(i) for i in entries]
    records = (yield [Call(command=("HMGET", keys.records, *ids))])[0] if ids else []
    chosen = [i for i, value in zip(ids, records, strict=True) if _task(value) == task]
    found = yield from find_many(keys, chosen[:limit])
    return [pending_of(f) for f in found]


def _task(value: Any) -> str | None:
    try:
        return None if value is None else Record.decode(as_text(value)).task
    except MalformedTimerKey:
        return None
