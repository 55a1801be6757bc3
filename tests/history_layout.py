"""History records written straight into Redis in the layout ``timers/store/lua/history.lua``
describes (a pipeline, not the scripts: a million records in seconds), for the tests of
its upkeep and its reads: with ``indexed``, as this release writes them (batch ids
``::<n>``, each record in its task's zset and a dead one in ``P|histf``), else as the
previous release did (batch ids ``:<n>``, no index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timers.model.history import EndKind, HistoryRecord
from timers.model.keys import Keyspace


def write_history(client: Any, keys: Keyspace, records: Sequence[HistoryRecord], *,
                  ended_ms: int, expiry_ms: int, batch: int = 8, indexed: bool = True,
                  chunk: int = 10_000) -> None:
    """``records`` (ids escaped already, oldest first), in batches of ``batch`` ending at
    ``ended_ms`` and expiring at ``expiry_ms`` (the i-th batch 1 ms later than the one
    before, both): as ``finish.lua`` would have written them in that many calls."""
    mark = "::" if indexed else ":"
    for start in range(0, len(records), chunk):
        part = records[start:start + chunk]
        first = int(client.incrby(keys.sequence, len(part))) - len(part)
        pipe = client.pipeline(transaction=False)
        hist: dict[str, int] = {}
        expiry: dict[str, int] = {}
        lists: dict[str, str] = {}
        values: dict[str, str] = {}
        by_task: dict[str, dict[str, int]] = {}
        dead: dict[str, int] = {}
        for k in range(0, len(part), batch):
            group = part[k:k + batch]
            name = f"{mark}{first + k + 1}"
            hist[name] = ended_ms + (start + k) // batch
            expiry[name] = expiry_ms + (start + k) // batch
            lists[name] = ":".join(r.id for r in group)
            for record in group:
                values[record.id] = f"{name}|{record.encode()}"
                end = round(record.ended * 1000)
                by_task.setdefault(record.task, {})[record.id] = end
                if record.outcome is EndKind.DEAD:
                    dead[record.id] = end
        pipe.zadd(keys.history, hist)
        pipe.zadd(keys.history_expiry, expiry)
        pipe.hset(keys.history_batches, mapping=lists)
        pipe.hset(keys.history_records, mapping=values)
        if indexed:
            for task, ends in by_task.items():
                pipe.zadd(keys.history_task(task), ends)
            if dead:
                pipe.zadd(keys.history_failed, dead)
        pipe.execute()


def records_of(n: int, ended_ms: int, task: str = "reminders.sms", *, prefix: str = "r",
               dead_every: int = 0, rare: dict[int, str] | None = None) -> list[HistoryRecord]:
    """``n`` records ``<prefix><i>`` of ``task``, the i-th ended at ``ended_ms`` + i: every
    ``dead_every``-th dead (0: none), and record ``i`` of task ``rare[i]``."""
    rare = rare or {}
    return [HistoryRecord(f"{prefix}{i}", rare.get(i, task),
                          EndKind.DEAD if dead_every and i % dead_every == 0
                          else EndKind.COMPLETED, (ended_ms + i) / 1000, "host:1:a", 3, 1, 12,
                          "ValueError: boom" if dead_every and i % dead_every == 0 else "")
            for i in range(n)]
